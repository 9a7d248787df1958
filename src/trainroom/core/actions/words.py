"""Plans and results in words and units for people: every client's confirmation and result
lines (the CLI's, the control room's confirm screen) come from here, never a field's name or a
Python repr. Each action says its plan's lines (`Action.plan_lines`) with these helpers."""

from __future__ import annotations

from typing import Any

from trainroom.core.units import fmt_bytes

# Fields that steer the keeper, not a person (a kill plan's verdict, its "empty" flag).
BOOKKEEPING = frozenset({"ok", "nothing_left", "empty", "label", "expect"})


def label(key: str) -> str:
    """A field's name as words: `vram_wait_s` -> "vram wait", `page_cache_bytes` -> "page cache"."""
    for suffix in ("_bytes", "_s"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def figure(key: str, value: Any) -> str:
    """One value in words and units, by what its field's name says it counts."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return fmt_bytes(value)
    if key.endswith("_s") and isinstance(value, (int, float)):
        return f"{value:.1f} s"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, dict):
        return evidence(value) or "none"
    if isinstance(value, list):
        if not value:
            return "none"
        if all(isinstance(x, (int, str)) for x in value):
            return ", ".join(str(x) for x in value)
        return f"{len(value)}"
    return str(value)


def evidence(d: dict[str, Any]) -> str:
    """A before/after record as "members 2, vram 1.2 GiB" (bookkeeping and unknowns left out)."""
    return ", ".join(
        f"{label(k)} {figure(k, v)}"
        for k, v in d.items()
        if k not in BOOKKEEPING and v is not None and not is_block(v)
    )


def fields(plan: dict[str, Any]) -> list[str]:
    """A plan no action words on its own: one field a line, in words."""
    return [f"  {label(k)}: {figure(k, v)}" for k, v in plan.items() if k not in BOOKKEEPING]


def steps(xs: Any) -> str:
    """Checkpoint steps as "steps 100, 200" ("step ?" for one without a step)."""
    got = ["?" if s is None else str(s) for s in xs]
    return ("step " if len(got) == 1 else "steps ") + ", ".join(got)


def verdict(action: str, ok: bool, message: str, after: dict[str, Any]) -> str:
    """An action's outcome in one line: ok / slow / refused, said once (a keeper's "resume
    refused: ..." is not prefixed again)."""
    if ok:
        return ("slow: " if after.get("verdict") == "slow" else "ok: ") + message
    said = message.startswith((f"{action} refused", f"{action}:", "refused", "cancel"))
    return message if said else "refused: " + message


def outcome(action: str, ok: bool, message: str, after: dict[str, Any]) -> str:
    """What became of an action, in two or three words after its name: done, refused,
    cancelled, or done in part (a kill whose processes are gone while the driver still holds
    their memory)."""
    if ok:
        return f"{action}: done" + (", but slow" if after.get("verdict") == "slow" else "")
    if message.startswith("cancel") or after.get("vram_wait_cancelled"):
        return f"{action}: cancelled"
    if message.startswith((f"{action} refused", "refused")):
        return f"{action}: refused"
    if after.get("members") == 0:
        return f"{action}: done in part"
    return f"{action}: not done"


def is_block(value: Any) -> bool:
    """A result's field that is read as a block of its own, not a figure: a many-line text (a
    dump's stacks) or a list of rank blocks (a torchrun dump's)."""
    if isinstance(value, str):
        return "\n" in value.strip()
    return isinstance(value, list) and any(isinstance(v, dict) and "stacks" in v for v in value)


def blocks(after: dict[str, Any]) -> list[tuple[str, str]]:
    """(heading, text) of each block a result carries, each rank's under its own heading
    ("rank 1 (pid 4242), read by faulthandler"), a rank that could not be read with why."""
    out: list[tuple[str, str]] = []
    for key, value in after.items():
        if not is_block(value):
            continue
        if isinstance(value, str):
            how = after.get("method")
            out.append((label(key) + (f" (read by {how})" if how else ""), value))
            continue
        for item in value:
            if not isinstance(item, dict):
                continue
            who = f"rank {item.get('rank')} (pid {item.get('pid')})"
            text = str(item.get("stacks") or "")
            how = f", read by {item.get('method')}" if item.get("method") and text else ""
            out.append((who + how, text or f"({item.get('message') or 'nothing read'})"))
    return out

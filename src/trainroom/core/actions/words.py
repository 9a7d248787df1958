"""Plans and results in words and units for people: every client's confirmation and result
lines (the CLI's, the control room's confirm screen) come from here, never a field's name or a
Python repr. Each action says its plan's lines (`Action.plan_lines`) with these helpers; a plan
no action words on its own (or one this code cannot read: an older keeper's) is said field by
field by `plan_fields`, the target first (the one generic plan renderer, the CLI's and the
control room's)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from trainroom.core.units import UNKNOWN, fmt_bytes, fmt_duration, signal_name

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


# --------------------------------------------------------------------------- any plan, in words

# What a person confirms first: the exact target.
_TARGET_FIRST = (
    "target",
    "argv",
    "command",
    "checkpoint",
    "step",
    "lost",  # what a resume from that checkpoint loses (ResumePlan.lost): weighed before the rest
    "pgid",
    "members",
    "pids",
    "delete",
    "path",
    "root",
    "method",
    "device",
)
# Fields shown first in a record line, in this order, when present.
_RECORD_KEYS = ("pid", "state", "step", "path", "bytes", "size_bytes", "rss_bytes", "cmdline", "why", "kind")
# Bookkeeping a person does not confirm: the verdict (the dialog is the verdict), how a template
# shaped the command, the note (the keeper's message says it), identity checks by start time.
HIDDEN_KEYS = frozenset(
    {"ok", "templated", "note", "expect", "run_id", "run", "ppid", "pgid_of", "in_group", "digest"}
)
_HIDDEN_SUFFIXES = ("_ticks", "start_time", "create_time")
# Names in words where the field's own name says it badly.
_WORDS = {
    "pgid": "process group",
    "leader_pid": "group leader",
    "members": "processes",
    "strangers": "left alone (not proven the run's)",
    "refusals": "refused because",
    "argv": "command",
    "cmdline": "",
    "died_at_step": "died at step",
    "from_step": "from step",
    "attempt_ended_at": "attempt ended",
    "bytes_to_free": "to free",
    "bytes_freed": "freed",
    "freed_bytes": "freed",
    "page_cache_bytes": "page cache",
    "mem_available_bytes": "memory available",
    "vram_used_bytes": "VRAM used",
    "vram_bytes": "VRAM",
    "driver_bytes": "VRAM (driver)",
    "checkpoint_bytes": "checkpoint size",
    "rss_bytes": "resident",
    "size_bytes": "size",
    "disk_used_bytes": "disk used",
    "bytes_requested": "bytes requested",
    "passed_over": "passed over",
    "manual_command": "by hand",
}


def hidden(key: str) -> bool:
    return key in HIDDEN_KEYS or key.endswith(_HIDDEN_SUFFIXES)


def words(key: str) -> str:
    """A field's name in words: `steps_lost` -> `steps lost`, `page_cache_bytes` -> `page cache`."""
    if key in _WORDS:
        return _WORDS[key]
    return key.removesuffix("_bytes").removesuffix("_s").replace("_", " ")


def _name(key: str) -> str:
    """A mapping's key: a field's name in words, a name of the trainer's own (a tensor
    `model.layers.0.self_attn.q_proj.weight`, a path) as it is, underscores and all."""
    return words(key) if key.isidentifier() and key.islower() and "__" not in key else key


def _is_bytes(key: str) -> bool:
    return "bytes" in key.split("_") or key in ("vram", "freed")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def value_text(key: str, value: object) -> str:
    if value is None:
        return UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in ("exit_signal", "signal_number") and isinstance(value, int):
        return f"{signal_name(value)} ({value})"
    if isinstance(value, (int, float)) and _is_bytes(key):
        return fmt_bytes(value)
    if isinstance(value, float) and key.endswith("_s"):
        return fmt_duration(value)
    if isinstance(value, (int, float)) and (key.endswith(("_time", "_at")) or key == "t") and value > 1e8:
        return _clock(value)  # an epoch timestamp
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if key in ("argv", "cmd", "cmdline", "command"):
            return " ".join(str(v) for v in value)
        if all(not isinstance(v, (Mapping, list, tuple)) for v in value):
            return ", ".join(str(v) for v in value) if value else "none"
        return f"{len(value)} items"
    if isinstance(value, Mapping):
        return ", ".join(
            f"{_name(str(k))} {value_text(str(k), v)}" for k, v in value.items() if not hidden(str(k))
        )
    return str(value)


def record_line(rec: Mapping[str, object]) -> str:
    """One record of a list (a process, a checkpoint): its fields in words, `·` between them."""
    keys = [k for k in _RECORD_KEYS if k in rec] + [k for k in rec if k not in _RECORD_KEYS]
    parts = []
    for k in keys:
        if hidden(k) or rec[k] is None or k == "pgid":
            continue
        name = words(k)
        parts.append(f"{name} {value_text(k, rec[k])}" if name else value_text(k, rec[k]))
    return "  ·  ".join(parts)


def _ordered(plan: Mapping[str, object]) -> list[str]:
    return [k for k in _TARGET_FIRST if k in plan] + [k for k in plan if k not in _TARGET_FIRST]


def plan_fields(plan: Mapping[str, object]) -> list[str]:
    """Every field of a plan but bookkeeping, the target first: scalars as `name: value`, lists
    of records one indented line each."""
    out: list[str] = []
    for key in _ordered(plan):
        value = plan[key]
        if hidden(key) or value is None or value == [] or value == {}:
            continue  # bookkeeping, or nothing to say
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
            out.append(f"{words(key)} ({len(value)}):")
            out.extend("  " + record_line(v) for v in value if isinstance(v, Mapping))
        elif (
            isinstance(value, Mapping)
            and value
            and any(isinstance(v, (Mapping, list)) for v in value.values())
        ):
            out.append(f"{words(key)}:")
            out.extend("  " + line for line in plan_fields(value))
        elif (
            isinstance(value, (list, tuple)) and key not in ("argv", "cmdline", "command") and len(value) > 1
        ):
            out.append(f"{words(key)}:")
            out.extend(f"  {v}" for v in value)
        else:
            out.append(f"{words(key)}: {value_text(key, value)}")
    return out

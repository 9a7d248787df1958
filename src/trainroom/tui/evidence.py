"""Plans, outcomes and before -> after evidence in words and human units: pure, no Textual.

The keeper's plan for an action is a dict whose shape depends on the action (a kill plan lists
the process group and its members, a prune plan the checkpoints and bytes). It is shown whole but
for bookkeeping (start ticks, the run's own id), the target first, each field by a name in words
(`steps lost`, not `steps_lost`), bytes as GiB, epoch times as clock times. Before -> after is a
short table, one row a figure.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from trainroom.core.protocol import Reply
from trainroom.core.units import signal_name

from . import fmt

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


class ActionOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How an action ended, as the result screen shows it."""

    action: str
    ok: bool
    message: str
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    details: dict[str, object] = {}  # the keeper's plan, or its report of what it did

    @classmethod
    def of_reply(cls, action: str, reply: Reply) -> ActionOutcome:
        return cls(
            action=action,
            ok=reply.ok,
            message=reply.message,
            before=reply.before,
            after=reply.after,
            details=reply.plan,
        )

    @classmethod
    def failed(cls, action: str, message: str) -> ActionOutcome:
        return cls(action=action, ok=False, message=message)


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


def value_text(key: str, value: object) -> str:
    if value is None:
        return fmt.UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key in ("exit_signal", "signal_number") and isinstance(value, int):
        return f"{signal_name(value)} ({value})"
    if isinstance(value, (int, float)) and _is_bytes(key):
        return fmt.nbytes(value)
    if isinstance(value, float) and key.endswith("_s"):
        return fmt.duration(value)
    if isinstance(value, (int, float)) and (key.endswith(("_time", "_at")) or key == "t") and value > 1e8:
        return fmt.clock(value)  # an epoch timestamp
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


def plan_lines(plan: Mapping[str, object]) -> list[str]:
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
            out.extend("  " + line for line in plan_lines(value))
        elif (
            isinstance(value, (list, tuple)) and key not in ("argv", "cmdline", "command") and len(value) > 1
        ):
            out.append(f"{words(key)}:")
            out.extend(f"  {v}" for v in value)
        else:
            out.append(f"{words(key)}: {value_text(key, value)}")
    return out


def before_after_rows(
    before: Mapping[str, object], after: Mapping[str, object]
) -> list[tuple[str, str, str]]:
    """(what, before, after) for every figure either side has, bookkeeping left out; a side that
    does not have it is a dash."""
    keys = list(before) + [k for k in after if k not in before]
    rows = []
    for k in keys:
        if hidden(k):
            continue
        b = value_text(k, before.get(k)) if k in before else fmt.UNKNOWN
        a = value_text(k, after.get(k)) if k in after else fmt.UNKNOWN
        rows.append((words(k), b, a))
    return rows


def before_after_lines(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """`what: before -> after`, one a line (what the table shows, as text)."""
    return [f"{k}: {b} -> {a}" for k, b, a in before_after_rows(before, after)]


def soft_wrap(text: str, width: int) -> list[str]:
    """`text` cut into lines of at most `width` at spaces or path separators (a path breaks after
    a `/`, never mid-name); a word longer than a line is cut where it must be. A continuation is
    indented by two."""
    if width < 8 or len(text) <= width:
        return [text]
    out: list[str] = []
    line = ""
    for piece in _pieces(text):
        room = width - (2 if out else 0)
        if len(line) + len(piece) <= room:
            line += piece
            continue
        if line.strip():
            out.append(("  " if out else "") + line.rstrip())
        line = piece.lstrip()
        while len(line) > width - 2:
            out.append(("  " if out else "") + line[: width - 2])
            line = line[width - 2 :]
    if line.strip():
        out.append(("  " if out else "") + line.rstrip())
    return out


def _pieces(text: str) -> list[str]:
    """Words with their trailing space, and path parts with their trailing `/`."""
    pieces: list[str] = []
    cur = ""
    for ch in text:
        cur += ch
        if ch in " /":
            pieces.append(cur)
            cur = ""
    if cur:
        pieces.append(cur)
    return pieces

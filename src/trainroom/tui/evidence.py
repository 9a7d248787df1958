"""Plans, outcomes and before -> after evidence as lines of text: pure, no Textual.

The keeper's plan for an action is a dict whose shape depends on the action (a kill plan lists
the PGID and its members, a prune plan the checkpoints and bytes). The control room shows it
whole rather than guessing which fields matter: figures under a `*_bytes` key read as bytes,
lists of records as one line a record.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from trainroom.core.protocol import Reply

from . import fmt

# Fields shown first in a record line, in this order, when present.
_RECORD_KEYS = ("pid", "pgid", "state", "status", "step", "path", "name", "size_bytes", "cmdline", "cmd")


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


def value_text(key: str, value: object) -> str:
    if value is None:
        return fmt.UNKNOWN
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and (key.endswith("_bytes") or key in ("bytes", "vram", "freed")):
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
        return ", ".join(f"{k}={value_text(str(k), v)}" for k, v in value.items())
    return str(value)


def record_line(rec: Mapping[str, object]) -> str:
    keys = [k for k in _RECORD_KEYS if k in rec] + [k for k in rec if k not in _RECORD_KEYS]
    return "  ".join(f"{k} {value_text(k, rec[k])}" for k in keys)


# Plan fields a person does not need to confirm: the verdict (the dialog is the verdict), whether a
# template shaped the command, and the note (the keeper's message says it).
HIDDEN_PLAN_KEYS = frozenset({"ok", "templated", "note"})


def plan_lines(plan: Mapping[str, object]) -> list[str]:
    """Every field of a plan: scalars as `key: value`, lists of records one indented line each."""
    out: list[str] = []
    for key, value in plan.items():
        if key in HIDDEN_PLAN_KEYS or value is None or value == []:
            continue  # bookkeeping, or nothing to say
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, Mapping) for v in value):
            out.append(f"{key}: {len(value)}")
            out.extend("  " + record_line(v) for v in value)
        elif (
            isinstance(value, Mapping)
            and value
            and any(isinstance(v, (Mapping, list)) for v in value.values())
        ):
            out.append(f"{key}:")
            out.extend("  " + line for line in plan_lines(value))
        else:
            out.append(f"{key}: {value_text(key, value)}")
    return out


def before_after_lines(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """`key: before -> after` for every key either side has, in the order they appear."""
    keys = list(before) + [k for k in after if k not in before]
    out = []
    for k in keys:
        b = value_text(k, before.get(k)) if k in before else fmt.UNKNOWN
        a = value_text(k, after.get(k)) if k in after else fmt.UNKNOWN
        out.append(f"{k}: {b} -> {a}")
    return out

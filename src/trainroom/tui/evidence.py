"""Outcomes and before -> after evidence in words and human units: pure, no Textual.

A plan reads as its action words it (core/actions/render.py); the fields of a record in words
(`steps lost`, not `steps_lost`; bytes as GiB; epoch times as clock times) are core's
(core/actions/words.py), the same for the CLI. Before -> after is a short table, one row a figure.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from trainroom.core.actions.words import hidden, plan_fields, record_line, value_text, words
from trainroom.core.wire.protocol import Reply

from . import fmt

__all__ = ["ActionOutcome", "before_after_rows", "hidden", "plan_lines", "record_line", "value_text", "words"]


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


def plan_lines(plan: Mapping[str, object]) -> list[str]:
    """A plan's fields in words, the target first (core's one generic plan renderer)."""
    return plan_fields(plan)


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

"""A finding: one diagnosis with its evidence, raised by a rule and shown by every client.

Each rule lives in one place in `core/` and is a pure function of observations and a clock; the
keeper only diffs what the rules return against what is open, journals raises and clears, and
stamps first/last seen.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trainroom.core.vocab import SEVERITY_RANK as SEVERITY_RANK
from trainroom.core.vocab import ActionName, FindingCode
from trainroom.core.vocab import Severity as Severity


class Target(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What a finding's fix key acts on when that is not the run's own trainer: the processes a
    targeted kill (`kill --finding IDENT`) signals, named in words for the key's label
    ("[k] kill pid 4974, the second trainer"). The keeper checks each pid again when it plans."""

    pids: list[int] = []
    # Each pid's start (/proc/PID/stat field 22) when the finding saw it, in the order of `pids`
    # (None: unknown): a pid that names another process by the time of the kill is refused.
    start_ticks: list[int | None] = []
    label: str = ""  # in words, without the verb: "pid 4974, the second trainer"

    def processes(self) -> list[tuple[int, int | None]]:
        ticks = list(self.start_ticks) + [None] * (len(self.pids) - len(self.start_ticks))
        return list(zip(self.pids, ticks, strict=False))


class Finding(msgspec.Struct, kw_only=True, omit_defaults=True):
    # A code of the catalogue (`vocab.CATALOGUE`): a journal record of a newer version with a
    # code this one does not know fails to decode and is counted as an unknown record.
    code: FindingCode
    severity: Severity
    message: str
    action: ActionName | None = None
    # What `action` acts on when it is not the run's trainer (a kill of a duplicate, a lock
    # holder, leftovers of earlier attempts). None: the action's usual target.
    target: Target | None = None
    # What tells two open findings of one code apart (a rank, a lock path, a tensor name).
    key: str = ""
    evidence: dict[str, Any] = {}
    first_seen: float = 0.0
    last_seen: float = 0.0

    @property
    def ident(self) -> str:
        return f"{self.code}:{self.key}" if self.key else self.code


def order(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then newest first."""
    return sorted(findings, key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), -f.first_seen, f.code))

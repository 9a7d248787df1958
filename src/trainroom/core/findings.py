"""A finding: one diagnosis with its evidence, raised by a rule and shown by every client.

Each rule lives in one place in `core/` and is a pure function of observations and a clock; the
keeper only diffs what the rules return against what is open, journals raises and clears, and
stamps first/last seen.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trainroom.core.vocab import SEVERITY_RANK as SEVERITY_RANK
from trainroom.core.vocab import FindingCode
from trainroom.core.vocab import Severity as Severity


class Action(msgspec.Struct, frozen=True, kw_only=True):
    """An action a client asks the keeper for: its name on the wire, its key, what it does."""

    name: str  # the protocol's `Request.action`, and what a finding's `action` names
    # The control room's default key for it, in Textual's names (`trainroom.toml` [keys] remaps
    # it). What changes the world takes a capital or a ctrl chord (k9s kills with ctrl+k), never
    # a letter a vim, k9s or lazygit user presses to move: j/k/g/G scroll, / searches.
    key: str
    description: str  # what it does, in one line (the help screen, the palette, tooltips)
    destructive: bool  # changes the world: clients show the keeper's plan and ask first


# Every action, once: the control room's bindings and `ACTION_KEYS` derive from this table.
ACTIONS: tuple[Action, ...] = (
    Action(
        name="kill",
        key="ctrl+k",
        description="Kill the trainer's process group (SIGTERM, then SIGKILL) and confirm VRAM fell",
        destructive=True,
    ),
    Action(
        name="reclaim",
        key="C",
        description="Reclaim the host page cache (cgroup memory.reclaim or drop_caches)",
        destructive=True,
    ),
    Action(
        name="prune",
        key="P",
        description="Prune checkpoints, keeping the last verified ones, pinned and latest",
        destructive=True,
    ),
    Action(
        name="resume",
        key="R",
        description="Resume from the last verified checkpoint as a new attempt",
        destructive=True,
    ),
    Action(
        name="dump",
        key="d",
        description="Dump the trainer's stacks (faulthandler, or py-spy when uninstrumented)",
        destructive=False,
    ),
    Action(
        name="continue",
        key="U",
        description="Continue the trainer's stopped processes (SIGCONT), proven the run's",
        destructive=True,
    ),
    Action(
        name="verify",
        key="v",
        description="Verify the latest checkpoint (digest, NaN/Inf, shapes, outlier std)",
        destructive=False,
    ),
    Action(
        name="bench",
        key="b",
        description="Run the matmul bench on the run's device: is the hardware fine?",
        destructive=False,
    ),
)

# The action names a finding can suggest, with their keys.
ACTION_KEYS: dict[str, str] = {a.name: a.key for a in ACTIONS}


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
    action: str | None = None
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

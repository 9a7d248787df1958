"""A finding: one diagnosis with its evidence, raised by a rule and shown by every client.

Each rule lives in one place in `core/` and is a pure function of observations and a clock; the
keeper only diffs what the rules return against what is open, journals raises and clears, and
stamps first/last seen.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Severity = Literal["info", "warning", "critical"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}

# The action names a finding can suggest; each is one key in the control room and one CLI verb.
ACTION_KEYS: dict[str, str] = {
    "kill": "k",
    "reclaim": "c",
    "prune": "p",
    "resume": "r",
    "dump": "d",
    "verify": "v",
    "bench": "b",
}


class Finding(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: str
    severity: Severity
    message: str
    action: str | None = None
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

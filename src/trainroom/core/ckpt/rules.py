"""The findings a checkpoint's verification raises: CKPT_REJECTED for a rejected one, and
MASKED_ERROR when its load failed behind an error that hides the real one; HOST_RAM_LOW before a
load the host cannot hold. Pure and cheap to import (no torch): the keeper evaluates them.

`masked_error`, `read_meminfo`, `load_need_bytes` and `host_ram_low` are the health layer's rules
in the making (`trainroom.core.ckpt.verify` re-exports them under these names until they move).
"""

from __future__ import annotations

import os
from types import EllipsisType

import msgspec

from trainroom.core.ckpt.report import VerifyReport
from trainroom.core.findings import Finding
from trainroom.core.health.crash import masked_error

# What a full (non-mmap) load needs beyond the file itself: torch, the interpreter, the copy.
LOAD_HEADROOM = 512 << 20
# The last verified checkpoint in words ("step 10"), None when none has verified, `...` unknown.
Verified = str | None | EllipsisType
# What CKPT_REJECTED's evidence carries of the report (those that say something).
_EVIDENCE = (
    "path",
    "reason",
    "problems",
    "size_bytes",
    "digest",
    "expected_digest",
    "nonfinite",
    "outliers",
    "arch_mismatch",
    "refused_types",
    "step",
)


def load_need_bytes(size_bytes: int) -> int:
    """RAM a resume's full `torch.load(map_location="cpu")` of a checkpoint needs."""
    return int(size_bytes) + LOAD_HEADROOM


def rejected_finding(report: VerifyReport, verified: Verified = ...) -> Finding | None:
    """CKPT_REJECTED for a report that did not pass (a deferred one is not a rejection).
    `verified`: the run's last verified checkpoint (its step, None for none), which a rejected
    candidate in quarantine leaves `latest` at; `...` when not known."""
    if report.ok or report.deferred:
        return None
    path = report.path
    where = f"step {report.step} " if report.step is not None else ""
    fields = msgspec.to_builtins(report)
    if verified is None:
        kept = "; it stays in quarantine, and no checkpoint has verified yet: there is none to resume from"
    elif verified is ...:
        kept = "; it stays in quarantine and `latest` is left as it was"
    else:
        kept = f"; it stays in quarantine and `latest` is left as it was, at the last verified checkpoint ({verified})"
    return Finding(
        code="CKPT_REJECTED",
        severity="critical",
        key=path,
        action="verify",
        message=(
            f"checkpoint {where}({os.path.basename(path)}) rejected: {report.reason}"
            + (kept if f"{os.sep}.quarantine{os.sep}" in path else "")
        ),
        evidence={k: fields[k] for k in _EVIDENCE if fields.get(k) not in (None, [], {})},
    )


def findings_for_report(report: VerifyReport, verified: Verified = ...) -> list[Finding]:
    """Every finding one verification report raises: CKPT_REJECTED, MASKED_ERROR."""
    out = [rejected_finding(report, verified)]
    if report.error_chain:
        out.append(
            masked_error(
                report.error_chain,
                during=f"torch.load {os.path.basename(report.path)}",
                key=report.path,
            )
        )
    return [f for f in out if f is not None]

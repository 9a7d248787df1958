"""The findings a checkpoint's verification raises: CKPT_REJECTED for a rejected one, and
MASKED_ERROR when its load failed behind an error that hides the real one; HOST_RAM_LOW before a
load the host cannot hold. Pure and cheap to import (no torch): the keeper evaluates them.

`masked_error`, `read_meminfo`, `load_need_bytes` and `host_ram_low` are the health layer's rules
in the making (`trainroom.core.ckpt.verify` re-exports them under these names until they move).
"""

from __future__ import annotations

import os

import msgspec

from trainroom.core.ckpt.report import VerifyReport
from trainroom.core.findings import Finding
from trainroom.core.health.crash import masked_error

# What a full (non-mmap) load needs beyond the file itself: torch, the interpreter, the copy.
LOAD_HEADROOM = 512 << 20
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


def rejected_finding(report: VerifyReport) -> Finding | None:
    """CKPT_REJECTED for a report that did not pass (a deferred one is not a rejection)."""
    if report.ok or report.deferred:
        return None
    path = report.path
    where = f"step {report.step} " if report.step is not None else ""
    fields = msgspec.to_builtins(report)
    return Finding(
        code="CKPT_REJECTED",
        severity="critical",
        key=path,
        action="verify",
        message=(
            f"checkpoint {where}({os.path.basename(path)}) rejected: {report.reason}"
            + (
                "; it stays in quarantine and `latest` is left as it was"
                if f"{os.sep}.quarantine{os.sep}" in path
                else ""
            )
        ),
        evidence={k: fields[k] for k in _EVIDENCE if fields.get(k) not in (None, [], {})},
    )


def findings_for_report(report: VerifyReport) -> list[Finding]:
    """Every finding one verification report raises: CKPT_REJECTED, MASKED_ERROR."""
    out = [rejected_finding(report)]
    if report.error_chain:
        out.append(
            masked_error(
                report.error_chain,
                during=f"torch.load {os.path.basename(report.path)}",
                key=report.path,
            )
        )
    return [f for f in out if f is not None]

"""The findings a checkpoint's verification raises: CKPT_REJECTED for a rejected one, and
MASKED_ERROR when its load failed behind an error that hides the real one; HOST_RAM_LOW before a
load the host cannot hold. Pure and cheap to import (no torch): the keeper evaluates them.

`masked_error`, `read_meminfo`, `load_need_bytes` and `host_ram_low` are the health layer's rules
in the making (`trainroom.core.ckpt.verify` re-exports them under these names until they move).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import msgspec

from trainroom.core import protocol as p
from trainroom.core.ckpt.formats import first_line
from trainroom.core.ckpt.report import VerifyReport
from trainroom.core.findings import Finding

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


def _link(x: Any) -> p.ErrorLink:
    if isinstance(x, p.ErrorLink):
        return x
    return msgspec.convert(x, p.ErrorLink)


def masked_error(chain: Sequence[Any], during: str = "torch.load", key: str = "") -> Finding | None:
    """MASKED_ERROR: the outermost error of a chain hides a different innermost one (the seed:
    `SystemError: readinto` over `OSError: [Errno 12] Cannot allocate memory`)."""
    links = [_link(x) for x in chain]
    if len(links) < 2:
        return None
    outer, inner = links[0], links[-1]
    if inner.type == outer.type and inner.errno == outer.errno:
        return None
    errno_part = (
        f" [Errno {inner.errno} {inner.errno_name or ''}]".rstrip() if inner.errno is not None else ""
    )
    enomem = inner.errno_name == "ENOMEM" or inner.type == "MemoryError"
    return Finding(
        code="MASKED_ERROR",
        severity="critical",
        key=key or during,
        action="reclaim" if enomem else None,
        message=(
            f"{during}: {outer.type}: {first_line(outer.message)} hides the real error "
            f"{inner.type}{errno_part}: {first_line(inner.message)}"
            + ("; host RAM ran out: reclaim page cache before retrying" if enomem else "")
        ),
        evidence={
            "chain": [msgspec.to_builtins(x) for x in links],
            "innermost": msgspec.to_builtins(inner),
            "during": during,
        },
    )


def read_meminfo(path: str | os.PathLike[str] = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes; empty when it cannot be read (one parser: probes.host)."""
    from trainroom.core.probes.host import read_meminfo as parse

    try:
        return parse(str(path))
    except OSError:
        return {}


def load_need_bytes(size_bytes: int) -> int:
    """RAM a resume's full `torch.load(map_location="cpu")` of a checkpoint needs."""
    return int(size_bytes) + LOAD_HEADROOM


def host_ram_low(
    mem_available: int | None, need_bytes: int, what: str, *, floor_bytes: int = 0
) -> Finding | None:
    """HOST_RAM_LOW before a load: MemAvailable is short of what the load needs (or of a floor: the
    seed's torch.load turned into a lottery under 1 GB and failed under 3 GB free)."""
    if mem_available is None:
        return None
    need = max(need_bytes, floor_bytes)
    if mem_available >= need:
        return None
    return Finding(
        code="HOST_RAM_LOW",
        severity="critical",
        action="reclaim",
        key=what,
        message=(
            f"host RAM {mem_available / 1e9:.1f} GB available, loading {what} needs "
            f"{need / 1e9:.1f} GB: reclaim page cache (or stop other work) before resuming"
        ),
        evidence={"mem_available": mem_available, "need_bytes": need, "what": what},
    )


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
                "; it stays in quarantine and `latest` still points at the last verified one"
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

"""Promotion: a verified candidate moves out of quarantine into its step directory, with its
manifest, and `latest` follows; a rejected one stays in quarantine with why.

A promotion builds the step directory under a dot name, writes the manifest, renames it into
place, then swaps `latest`: a kill at any moment leaves `latest` on a verified checkpoint (and
`Quarantine.sweep` finishes or undoes what it left). Used by the keeper for announced candidates,
by the SDK when it verifies inline, and for the verified copies of a watched file.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainroom.core import protocol as p
from trainroom.core.ckpt import digest as digest
from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt import verify as verifier

# What a manifest keeps of the verification report (the journal keeps the rest but the stds).
REPORT_KEYS = (
    "format",
    "tensors",
    "params",
    "dtypes",
    "nonfinite",
    "outliers",
    "arch",
    "stds",
    "model_key",
    "seconds",
    "step",
)


def expected_for(
    root: str | os.PathLike[str],
    declared_arch: Mapping[str, Any] | None = None,
    candidate: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """What a new candidate is checked against: its save-time record, the declared config, and
    the latest verified checkpoint's fingerprint and stds."""
    out: dict[str, Any] = {}
    if candidate is not None:
        side = layout.read_json(Path(str(candidate) + layout.SAVED_SUFFIX)) or {}
        out.update({k: side[k] for k in ("digest", "size_bytes", "step") if side.get(k) is not None})
    if declared_arch:
        out["arch"] = dict(declared_arch)
    prev = layout.latest_manifest(root)
    if prev:
        rep = prev.get("report") or {}
        out["previous"] = {
            "path": prev.get("path", ""),
            "arch": rep.get("arch", {}),
            "stds": rep.get("stds", {}),
        }
    return out


def promote(
    candidate: str | os.PathLike[str],
    report: Mapping[str, Any],
    root: str | os.PathLike[str] | None = None,
    *,
    file_name: str | None = None,
    step: int | None = None,
) -> Path:
    """Move a verified candidate to `<root>/step-NNNNNN/` with its manifest, then point `latest`
    at it. Refuses a report that did not pass or that names other bytes."""
    cand = Path(candidate)
    r = layout.checkpoint_root(root) if root is not None else cand.parent.parent
    if not report.get("ok"):
        raise layout.CheckpointError(f"{cand.name} did not verify ({report.get('reason')}): not promoting it")
    side = layout.read_json(Path(str(cand) + layout.SAVED_SUFFIX)) or {}
    st = cand.stat()
    if report.get("size_bytes") not in (None, st.st_size):
        raise layout.CheckpointError(f"{cand.name} changed since it was verified ({st.st_size} bytes now)")
    if step is None:
        step = report.get("step") if report.get("step") is not None else side.get("step")
    if step is None:
        m = re.search(r"(\d+)", cand.name)
        step = int(m.group(1)) if m else 0
    target = layout.unique_path(r / layout.step_dir_name(int(step)))
    stage = r / f".promote-{target.name}.{os.getpid()}"
    stage.mkdir()
    fname = file_name or cand.name
    os.rename(cand, stage / fname)
    manifest = {
        "version": 1,
        "ok": True,
        "file": fname,
        "path": str(target / fname),
        "step": int(step),
        "size_bytes": st.st_size,
        "digest": report.get("digest") or side.get("digest"),
        "digest_algo": report.get("digest_algo", digest.DIGEST_ALGO),
        "saved_at": float(side.get("saved_at", st.st_mtime)),
        "verified_at": time.time(),
        "source": str(side.get("source", cand)),
        "report": {k: report.get(k) for k in REPORT_KEYS if k in report},
    }
    layout.write_json_atomic(stage / layout.MANIFEST, verifier._clean(manifest))
    layout.fsync_dir(stage)
    os.rename(stage, target)
    layout.fsync_dir(r)
    for suffix in (layout.SAVED_SUFFIX, layout.REASON_SUFFIX, layout.REPORT_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            Path(str(cand) + suffix).unlink()
    layout.point_latest(r, target)
    return target


def settle(
    candidate: str | os.PathLike[str],
    report: Mapping[str, Any],
    root: str | os.PathLike[str] | None = None,
    now: float | None = None,
) -> p.CheckpointState:
    """Act on a verdict: promote a verified candidate, keep a rejected one in quarantine with its
    reason, leave a deferred one (verifier timed out, RAM short) as a candidate. Returns the
    record the keeper journals (path stays the candidate's; `report` says where it went)."""
    cand = Path(candidate)
    r = layout.checkpoint_root(root) if root is not None else cand.parent.parent
    t = time.time() if now is None else now
    rep = dict(report)
    step = rep.get("step")
    if rep.get("ok"):
        target = promote(cand, rep, r)
        manifest = layout.read_json(target / layout.MANIFEST) or {}
        rep["promoted_dir"], rep["promoted_file"] = str(target), manifest.get("path")
        return p.CheckpointState(
            path=str(cand),
            step=manifest.get("step", step),
            state="verified",
            t=t,
            size_bytes=rep.get("size_bytes"),
            digest=rep.get("digest"),
            report=journal_report(rep),
        )
    if rep.get("deferred"):
        return p.CheckpointState(
            path=str(cand),
            step=step,
            state="candidate",
            t=t,
            reason=rep.get("reason"),
            size_bytes=rep.get("size_bytes"),
            digest=rep.get("digest"),
        )
    if cand.exists():
        layout.Quarantine(r).reject(cand, rep)
    return p.CheckpointState(
        path=str(cand),
        step=step,
        state="rejected",
        t=t,
        reason=rep.get("reason"),
        size_bytes=rep.get("size_bytes"),
        digest=rep.get("digest"),
        report=journal_report(rep),
    )


def journal_report(rep: Mapping[str, Any]) -> dict[str, Any]:
    """The report without the per-tensor stds (they live in the manifest; the journal stays small)."""
    return verifier._clean({k: v for k, v in rep.items() if k != "stds"})


def keep_verified_copy(
    src: str | os.PathLike[str],
    report: Mapping[str, Any],
    root: str | os.PathLike[str] | None = None,
    *,
    step: int | None = None,
) -> Path | None:
    """For a trainer that overwrites one file (nanoGPT's out/ckpt.pt): copy the version that just
    verified into the root and promote it. The copy's own digest must equal the verified one,
    else the trainer overwrote the file meanwhile and the copy is dropped (None)."""
    r = layout.checkpoint_root(root)
    q = layout.Quarantine(r)
    q.dir.mkdir(parents=True, exist_ok=True)
    src = Path(src)
    tmp = q.dir / f".{src.name}.{os.getpid()}.tmp"
    h = digest.new_hasher()
    try:
        with open(src, "rb") as fi, open(tmp, "xb") as fo:
            while chunk := fi.read(digest.READ_CHUNK):
                h.update(chunk)
                fo.write(chunk)
            fo.flush()
            os.fsync(fo.fileno())
        if digest.digest_hex(h) != report.get("digest"):
            tmp.unlink()
            return None
        s = step if step is not None else report.get("step")
        cand = layout.unique_path(
            q.dir / (f"{layout.step_dir_name(int(s))}-{src.name}" if s is not None else src.name)
        )
        os.rename(tmp, cand)
        layout.fsync_dir(q.dir)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    layout.write_json_atomic(
        Path(str(cand) + layout.SAVED_SUFFIX),
        {
            "step": s,
            "size_bytes": cand.stat().st_size,
            "digest": report.get("digest"),
            "digest_algo": digest.DIGEST_ALGO,
            "saved_at": src.stat().st_mtime,
            "source": str(src),
        },
    )
    rep = {**report, "size_bytes": cand.stat().st_size}
    return promote(cand, rep, r, file_name=src.name, step=s)

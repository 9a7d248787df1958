"""The watch on an uninstrumented trainer's checkpoints (nanoGPT overwrites `out/ckpt.pt`; the
Hugging Face Trainer writes `out/checkpoint-N/`, Lightning's ModelCheckpoint `step=N.ckpt`).

No reporter tells the keeper a checkpoint was written, so the keeper stats the configured globs
each second (`sight`): a matched file is a checkpoint, a matched Hugging Face or DCP directory
is one checkpoint (its files' bytes and newest mtime are its version), and a matched directory
of checkpoints (an HF `output_dir`, Lightning's `dirpath`) contributes each checkpoint in it.
`poll`, a pure function of those sightings and `now`, decides: a new version (size, mtime or
inode changed) is verified once it has held still for `settle_s`. The keeper runs the verification (its warm `verifier.WarmVerifier`, from a
worker thread), stats the file again, and hands both to `record_verdict`, which drops a verdict
about a version that has been overwritten meanwhile. Each call returns `CheckpointState` records
to journal; `watch_findings` gives CKPT_REJECTED for files whose current version failed.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from trainroom.core import protocol as p
from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.report import Expected, Previous, VerifyReport, journal_report
from trainroom.core.ckpt.rules import findings_for_report
from trainroom.core.findings import Finding

SETTLE_S = 2.0


class Sighting(msgspec.Struct, kw_only=True, frozen=True):
    path: str
    size: int
    mtime_ns: int
    ino: int

    @property
    def version(self) -> tuple[int, int, int]:
        return (self.size, self.mtime_ns, self.ino)


class WatchedFile(msgspec.Struct, kw_only=True):
    path: str
    size: int
    mtime_ns: int
    ino: int
    first_seen: float
    stable_since: float
    state: Literal["settling", "verifying", "verified", "rejected"] = "settling"
    version: int = 1  # how many versions of this path were seen
    digest: str | None = None
    step: int | None = None
    reason: str | None = None
    report: VerifyReport | None = None  # the current version's verdict, without the stds
    last_verified: Previous | None = None  # the newest good version, what the next is compared with

    def matches(self, s: Sighting) -> bool:
        return (self.size, self.mtime_ns, self.ino) == s.version


class WatchState(msgspec.Struct, kw_only=True):
    files: dict[str, WatchedFile] = {}


class VerifyRequest(msgspec.Struct, kw_only=True, frozen=True):
    """Verify this version of this file; hand the report back to `record_verdict`."""

    path: str
    size: int
    mtime_ns: int
    ino: int
    version: int
    expected: Expected = msgspec.field(default_factory=Expected)


def sight(patterns: Iterable[str], cwd: str | os.PathLike[str] = ".") -> list[Sighting]:
    """The I/O half: stat every checkpoint the globs match (relative to the trainer's cwd):
    files, checkpoint directories, and the checkpoints inside a matched framework root."""
    out: dict[str, Sighting] = {}
    for pat in patterns:
        full = pat if os.path.isabs(pat) else os.path.join(cwd, pat)
        for path in glob.glob(full, recursive=True):
            for unit in _units(Path(path)):
                seen = stat_one(os.path.abspath(unit))
                if seen is not None:
                    out[seen.path] = seen
    return sorted(out.values(), key=lambda s: s.path)


def _units(path: Path) -> list[Path]:
    if path.is_file():
        return [] if path.name.endswith(targets.SIDE_SUFFIXES) else [path]
    kind = targets.kind_of(path)
    if targets.is_dir_kind(kind):
        return [path]
    return targets.units_in(path) if kind == "root" else []


def stat_one(path: str) -> Sighting | None:
    """A file's (size, mtime, inode), or a directory checkpoint's (bytes, newest mtime, inode)."""
    if os.path.isdir(path):
        v = targets.dir_version(Path(path))
        return None if v is None else Sighting(path=path, size=v[0], mtime_ns=v[1], ino=v[2])
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not os.path.isfile(path):
        return None
    return Sighting(path=path, size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino)


def _request(f: WatchedFile) -> VerifyRequest:
    return VerifyRequest(
        path=f.path,
        size=f.size,
        mtime_ns=f.mtime_ns,
        ino=f.ino,
        version=f.version,
        expected=Expected(previous=f.last_verified),
    )


def poll(
    state: WatchState, sightings: Sequence[Sighting], now: float, *, settle_s: float = SETTLE_S
) -> tuple[WatchState, list[VerifyRequest], list[p.CheckpointState]]:
    """One second of watching: new and changed versions start settling; a version that held
    still for `settle_s` is asked to be verified (once). Files that vanished are forgotten."""
    files = {k: msgspec.structs.replace(v) for k, v in state.files.items()}
    requests: list[VerifyRequest] = []
    records: list[p.CheckpointState] = []
    seen = set()
    for s in sightings:
        seen.add(s.path)
        f = files.get(s.path)
        if f is None:
            f = files[s.path] = WatchedFile(
                path=s.path, size=s.size, mtime_ns=s.mtime_ns, ino=s.ino, first_seen=now, stable_since=now
            )
            records.append(
                p.CheckpointState(path=s.path, step=None, state="candidate", t=now, size_bytes=s.size)
            )
        elif not f.matches(s):
            # Written again (or still being written): a new version, settling from now.
            f.size, f.mtime_ns, f.ino = s.size, s.mtime_ns, s.ino
            f.stable_since = now
            if f.state != "settling":
                f.version += 1
                f.state, f.digest, f.reason, f.report = "settling", None, None, None
                records.append(
                    p.CheckpointState(path=s.path, step=None, state="candidate", t=now, size_bytes=s.size)
                )
            continue
        if f.state == "settling" and now - f.stable_since >= settle_s and f.size > 0:
            f.state = "verifying"
            requests.append(_request(f))
            records.append(
                p.CheckpointState(path=s.path, step=None, state="verifying", t=now, size_bytes=f.size)
            )
    for gone in set(files) - seen:
        del files[gone]
    return WatchState(files=files), requests, records


def held_still(state: WatchState, sightings: Sequence[Sighting], paths: Iterable[str]) -> list[Sighting]:
    """The sightings with those of `paths` taken as unchanged (what the watch recorded): an
    evaluation is running on them and may write into them (or just ended: a sighting taken during
    it may still be in hand); what it wrote is judged when it ends (`absorb`)."""
    same = {
        f.path: Sighting(path=f.path, size=f.size, mtime_ns=f.mtime_ns, ino=f.ino)
        for f in (state.files.get(p) for p in paths)
        if f is not None
    }
    return [same.get(s.path, s) for s in sightings]


def absorb(state: WatchState, path: str, version: int, current: Sighting | None) -> WatchState:
    """Take `current` as what version `version` of `path` looks like now, not as a new version: an
    evaluation wrote files into a watched directory and they were moved out again (its content is
    the one verified, its mtimes are not), so it is not verified and evaluated again, forever."""
    f = state.files.get(path)
    if f is None or current is None or f.version != version:
        return state
    files = dict(state.files)
    files[path] = msgspec.structs.replace(f, size=current.size, mtime_ns=current.mtime_ns, ino=current.ino)
    return WatchState(files=files)


def record_verdict(
    state: WatchState, request: VerifyRequest, report: VerifyReport, current: Sighting | None, now: float
) -> tuple[WatchState, list[p.CheckpointState], bool]:
    """Take a verification report for `request`. `current` is a stat taken after the verifier
    finished: if the file changed since the request, the verdict is about bytes that are gone and
    is dropped (the new version settles and is verified in its turn). Returns the new state, the
    records, and whether the verdict stood (only then may the keeper keep a verified copy)."""
    files = {k: msgspec.structs.replace(v) for k, v in state.files.items()}
    f = files.get(request.path)
    same = (
        current is not None
        and f is not None
        and f.version == request.version
        and f.matches(current)
        and current.version == (request.size, request.mtime_ns, request.ino)
    )
    if not same:
        if f is not None and f.state == "verifying" and f.version == request.version:
            f.state, f.stable_since = "settling", now
        return WatchState(files=files), [], False
    assert f is not None
    if report.deferred:
        # The verifier could not judge (timed out, RAM short): try this version again later.
        f.state, f.stable_since, f.reason = "settling", now, report.reason
        return WatchState(files=files), [], False
    f.digest, f.step, f.report = report.digest, report.step, msgspec.structs.replace(report, stds={})
    if report.ok:
        f.state, f.reason = "verified", None
        f.last_verified = Previous(path=f.path, arch=report.arch, stds=report.stds)
    else:
        f.state, f.reason = "rejected", report.reason
    rec = p.CheckpointState(
        path=f.path,
        step=f.step,
        state="verified" if report.ok else "rejected",
        t=now,
        reason=f.reason,
        size_bytes=report.size_bytes,
        digest=f.digest,
        report=journal_report(report),
    )
    return WatchState(files=files), [rec], True


def watch_findings(state: WatchState) -> list[Finding]:
    """CKPT_REJECTED (and MASKED_ERROR) for each watched file whose current version failed."""
    out: list[Finding] = []
    for f in state.files.values():
        if f.state == "rejected" and f.report is not None:
            out += findings_for_report(msgspec.structs.replace(f.report, path=f.path, ok=False))
    return out

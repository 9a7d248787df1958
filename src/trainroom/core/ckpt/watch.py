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

import msgspec

from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.report import Expected, Previous, VerifyReport, journal_report
from trainroom.core.ckpt.rules import findings_for_report
from trainroom.core.findings import Finding
from trainroom.core.vocab import WatchedState
from trainroom.core.wire import protocol as p

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
    state: WatchedState = "settling"
    version: int = 1  # how many versions of this path were seen
    digest: str | None = None
    step: int | None = None
    reason: str | None = None
    report: VerifyReport | None = None  # the current version's verdict, without the stds
    last_verified: Previous | None = None  # the newest good version, what the next is compared with
    verified_step: int | None = None  # the step of the newest version that verified
    seen_step: int | None = None  # the trainer's step when this version was first seen
    # Versions replaced before they held still for settle_s, or while being verified: never
    # verified (a file rewritten faster than it settles); `said` of them are in a keeper note.
    unverified: int = 0
    said: int = 0
    seen: int = 1  # versions seen (a write seen growing is one)
    judged: int = 0  # versions verified or rejected

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
    state: WatchState,
    sightings: Sequence[Sighting],
    now: float,
    *,
    settle_s: float = SETTLE_S,
    step: int | None = None,
) -> tuple[WatchState, list[VerifyRequest], list[p.CheckpointState]]:
    """One second of watching: new and changed versions start settling; a version that held
    still for `settle_s` is asked to be verified (once). Files that vanished are forgotten.
    `step`: the trainer's step now (a version's step when its own cannot be read)."""
    files = {k: msgspec.structs.replace(v) for k, v in state.files.items()}
    requests: list[VerifyRequest] = []
    records: list[p.CheckpointState] = []
    seen = set()
    for s in sightings:
        seen.add(s.path)
        f = files.get(s.path)
        if f is None:
            f = files[s.path] = WatchedFile(
                path=s.path,
                size=s.size,
                mtime_ns=s.mtime_ns,
                ino=s.ino,
                first_seen=now,
                stable_since=now,
                seen_step=step,
            )
            records.append(
                p.CheckpointState(path=s.path, step=None, state="candidate", t=now, size_bytes=s.size)
            )
        elif not f.matches(s):
            # Written again (or still being written): a new version, settling from now. The one
            # before was never verified if it was settling (unless this is the same write growing:
            # same inode, more bytes) or being verified (its verdict is about bytes now gone).
            growing = s.ino == f.ino and s.size > f.size
            if f.state == "verifying" or (f.state == "settling" and not growing):
                f.unverified += 1
            f.seen += 0 if growing else 1
            f.size, f.mtime_ns, f.ino = s.size, s.mtime_ns, s.ino
            f.stable_since = now
            f.seen_step = step if not growing else f.seen_step
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
    f.judged += 1
    if report.ok:
        f.state, f.reason = "verified", None
        f.last_verified = Previous(path=f.path, arch=report.arch, stds=report.stds)
        f.verified_step = report.step
    else:
        # A rejected rewrite of a file is not the version that verified before: say which.
        label = version_label(f) if f.version > 1 or f.verified_step is not None else None
        f.state, f.reason = "rejected", f"{label}: {report.reason}" if label else report.reason
    rec = p.CheckpointState(
        path=f.path,
        step=f.step if f.step is not None or report.ok else f.seen_step,
        state="verified" if report.ok else "rejected",
        t=now,
        reason=f.reason,
        size_bytes=report.size_bytes,
        digest=f.digest,
        report=journal_report(report),
    )
    return WatchState(files=files), [rec], True


def version_label(f: WatchedFile) -> str:
    """Which version of a rewritten file: "version 7 of ckpt.pt, step 137 (its own step unreadable:
    the trainer's when it was written), after step 120 verified"."""
    words = [f"version {f.version} of {os.path.basename(f.path)}"]
    if f.step is not None:
        words.append(f"step {f.step}")
    elif f.seen_step is not None:
        words.append(f"step ~{f.seen_step} (its own step unreadable: the trainer's when it was written)")
    if f.verified_step is not None:
        words.append(f"after step {f.verified_step} verified")
    return ", ".join(words)


def unverified_note(
    state: WatchState, path: str, settle_s: float = SETTLE_S
) -> tuple[WatchState, str | None]:
    """A keeper note for the versions of `path` never verified since the last note (each was
    rewritten before it held still for `settle_s`, or while it was verified), else None."""
    f = state.files.get(path)
    if f is None or f.unverified <= f.said:
        return state, None
    files = dict(state.files)
    files[path] = g = msgspec.structs.replace(f, said=f.unverified)
    n = g.unverified - f.said
    return WatchState(files=files), (
        f"{path}: {n} more version{'s' if n != 1 else ''} never verified (rewritten before "
        f"{'it' if n == 1 else 'they'} held still for {settle_s:g} s, or while being verified); "
        f"{g.judged} of at least {g.seen} versions seen were verified or rejected, {g.unverified} never: "
        "the trainer rewrites it faster than it can be checked"
    )


def watch_findings(state: WatchState) -> list[Finding]:
    """CKPT_REJECTED (and MASKED_ERROR) for each watched file whose current version failed, naming
    the version and its step."""
    out: list[Finding] = []
    for f in state.files.values():
        if f.state == "rejected" and f.report is not None:
            rep = msgspec.structs.replace(f.report, path=f.path, ok=False, reason=f.reason)
            found = findings_for_report(rep)
            for x in found:
                if x.code == "CKPT_REJECTED":
                    x.evidence["version"] = f.version
                    if f.report.step is None and f.seen_step is not None:
                        x.evidence["written_near_step"] = f.seen_step
                    if f.verified_step is not None:
                        x.evidence["last_verified_step"] = f.verified_step
            out += found
    return out

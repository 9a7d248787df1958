"""Life: an attempt that ended is `exited` (0, no signal) or `dead` with its cause, the step it
died at and what was lost since the last verified checkpoint. DEAD comes from the keeper's
waitpid (or a pidfd that says the process is gone), never from silence (scenario 1: log age detects
slowness, absence detects death)."""

from __future__ import annotations

import os
import re
import signal

from trainroom.core.findings import Finding
from trainroom.core.health.context import WatchContext
from trainroom.core.logs.loglines import NOT_STEPS, step_words
from trainroom.core.run.ended import clean_exit, how_ended
from trainroom.core.run.parts import AttemptView, WorkerView
from trainroom.core.run.state import RunState
from trainroom.core.units import fmt_bytes, signal_name
from trainroom.core.vocab import WatchState
from trainroom.core.wire import protocol as p


def ended_verdict(run: RunState, a: AttemptView, ctx: WatchContext) -> tuple[WatchState, str, list[Finding]]:
    at = f" at step {a.last_step}" if a.last_step is not None else ""
    if clean_exit(a):
        return "exited", f"attempt {a.n} {death_cause(a)}{at}", []
    if a.stopped:
        # The user's own kill: said as such, no DEAD, nothing to resume automatically.
        return "stopped", f"attempt {a.n} stopped by {a.stop_by}{at} ({death_cause(a)})", []
    w = run.worker_death(a)
    reason = (
        death_cause(a) if w is None else f"{worker_cause(w)}; then {launcher_name(a, run)} {death_cause(a)}"
    )
    return "dead", reason, [dead_finding(run, a, ctx)]


def fatal_worker(run: RunState, a: AttemptView) -> WorkerView | None:
    """While the launcher still lives: a rank that failed with no restart left. torch elastic now
    stops the other ranks and exits (about 2 s here); a rank that launched the others itself
    (Lightning's rank 0, the process started) restarts none and fails at its next collective
    (about 3 s here): either way the attempt is over, said at once."""
    w = run.worker_death(a)
    if w is None or (a.stop_until is not None and (w.ended_at or 0.0) <= a.stop_until):
        return None  # none failed, or a user's kill is under way: the rank's end is the kill's
    return w if w.restarts_left == 0 or (w.restarts_left is None and self_launched(run, a)) else None


def self_launched(run: RunState, a: AttemptView) -> bool:
    """The process started is a rank that launched the others itself (Lightning's launcher)."""
    lead = run.workers.get(a.pid)
    return lead is not None and lead.attempt == a.n


def dying_verdict(
    run: RunState, a: AttemptView, w: WorkerView, ctx: WatchContext
) -> tuple[WatchState, str, list[Finding]]:
    reason = f"{worker_cause(w)}; {_stopping(run, a)}"
    return "dead", reason, [dead_finding(run, a, ctx)]


def _stopping(run: RunState, a: AttemptView) -> str:
    """What follows a fatal rank death while the launcher lives."""
    if self_launched(run, a):
        return f"{launcher_name(a, run)} launched it and restarts no rank: the attempt is over"
    return f"{launcher_name(a, run)} is stopping the other ranks"


def worker_cause(w: WorkerView) -> str:
    """ "rank 1 killed by SIGKILL (pid 767)": a rank's process's end, the headline of a death
    under a launcher (torchrun's own exit code 1 comes second)."""
    how = how_ended(w.exit_code, w.exit_signal, unknown="ended (how is not known)")
    return f"rank {w.rank} {how} (pid {w.pid})"


def launcher_name(a: AttemptView, run: RunState | None = None) -> str:
    """What started the ranks, as the user would call it: torchrun, a rank that launched the
    others itself (Lightning's rank 0, the process started), or the leader by pid."""
    argv = a.argv
    if argv and (os.path.basename(argv[0]) == "torchrun" or "torch.distributed.run" in argv[:3]):
        return "torchrun"
    lead = run.workers.get(a.pid) if run is not None else None
    if lead is not None and lead.attempt == a.n:
        return f"rank {lead.rank} (pid {a.pid}, the process started)"
    return f"the launcher (pid {a.pid})"


def death_cause(a: AttemptView) -> str:
    return how_ended(a.exit_code, a.exit_signal, a.error)


def _lost(run: RunState, a: AttemptView) -> tuple[str, int | None]:
    """Where the attempt died and how many steps are lost since the last verified checkpoint
    (or, without one, since the attempt's first step)."""
    verified = run.last_verified()
    if a.last_step is None:
        return "before its first step", None
    if not a.instrumented and run.log_unit in NOT_STEPS:
        # The log counts batches or logged dicts: no subtraction from a checkpoint's step holds.
        ck = f"the last verified checkpoint is at step {verified.step}" if verified is not None else ""
        ck = ck or "no verified checkpoint"
        return f"at {step_words(a.last_step, run.log_unit)}; {ck}; steps lost not known", None
    if verified is not None and verified.step is not None:
        lost = max(0, a.last_step - verified.step)
        return (
            f"at step {a.last_step}; {lost} steps lost since the last verified checkpoint (step {verified.step})",
            lost,
        )
    start = a.first_step - 1 if a.first_step is not None else None
    lost_or_none = a.last_step - start if start is not None else None
    more = f", {lost_or_none} steps of this attempt lost" if lost_or_none is not None else ""
    if a.attached and start is not None:
        # It trained before trainroom attached: what it did then is lost too, unless it saved
        # a checkpoint of its own that trainroom never saw.
        more = (
            f", {lost_or_none} steps lost since trainroom attached (step {a.first_step}), and what "
            "it trained before that since a checkpoint of its own, if it saved one"
        )
    return f"at step {a.last_step}; no verified checkpoint{more}", lost_or_none


# An HF Trainer's checkpoint directory: `checkpoint-<global step>` in its output_dir.
_HF_CKPT = re.compile(r"checkpoint-(\d+)")
_SCAN_DIRS = 64  # sub-directories of the working directory looked into (output_dirs)
_unwatched_cache: dict[tuple[str, int, float | None], list[str]] = {}


def unwatched_checkpoints(run: RunState, a: AttemptView) -> list[str]:
    """HF `checkpoint-N/` directories in the attempt's working directory (or one level below,
    its output_dir) that no watch covers: what the trainer saved that trainroom never saw, newest
    step first, relative to the working directory. Read once per attempt end."""
    key = (a.cwd, a.n, a.ended_at)
    if key in _unwatched_cache:
        return _unwatched_cache[key]
    known = {c.path.rstrip("/") for c in run.checkpoints}
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(a.cwd) as top:
            subdirs = [e for e in top if e.is_dir(follow_symlinks=False)]
    except OSError:
        subdirs = []
    for e in subdirs[:_SCAN_DIRS]:
        places = [e]
        if not _HF_CKPT.fullmatch(e.name):
            try:
                with os.scandir(e.path) as inner:
                    places = [
                        x for x in inner if x.is_dir(follow_symlinks=False) and _HF_CKPT.fullmatch(x.name)
                    ]
            except OSError:
                places = []
        for x in places:
            m = _HF_CKPT.fullmatch(x.name)
            if m is not None and os.path.abspath(x.path) not in known:
                found.append((int(m.group(1)), os.path.relpath(x.path, a.cwd)))
    out = [path for _, path in sorted(found, reverse=True)]
    _unwatched_cache.clear()
    _unwatched_cache[key] = out
    return out


def unwatched_words(paths: list[str]) -> str:
    """What DEAD says of checkpoints nobody watched: which, and how to have them watched."""
    newest = paths[0]
    glob = os.path.join(os.path.dirname(newest), "checkpoint-*")
    more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
    return (
        f"; {newest}/{more} in the working directory is not watched, so it was never verified: "
        f"watch it with `trainroom launch --watch-ckpt '{glob}'` (or `watch = [\"{glob}\"]` under "
        "[checkpoints] in trainroom.toml), or resume from it by hand"
    )


def dead_finding(run: RunState, a: AttemptView, ctx: WatchContext) -> Finding:
    """DEAD: the cause, the last step, and what was lost since the last verified checkpoint.
    Under a launcher, a rank's death is the cause and the launcher's exit comes second."""
    w = run.worker_death(a) if a.ended_at is not None else fatal_worker(run, a)
    cause = death_cause(a) if w is None else worker_cause(w)
    signalled = a.exit_signal if w is None else w.exit_signal
    crash = a.crash or ctx.log_crash
    verified = run.last_verified()
    lost_txt, lost = _lost(run, a)
    if w is not None and w.exit_signal is not None:
        # A rank killed by a signal leaves no traceback; the other ranks' (a peer closed the
        # connection) are what followed from it, not its cause.
        why = "no traceback"
    elif crash is not None and crash.chain:
        inner = crash.chain[-1]
        why = f"{inner.type}: {inner.message}"
    elif signalled is not None:
        why = "no traceback"
    else:
        why = ""
    oom_hint = ""
    avail = ctx.host.effective_available_bytes if ctx.host is not None else None
    if signalled == signal.SIGKILL and avail is not None and avail < ctx.thresholds.host_ram_low_bytes:
        oom_hint = f"; host RAM was low ({fmt_bytes(avail)} available): the OOM killer is a suspect"
    then = ""
    if w is not None:
        then = (
            f"; then {launcher_name(a, run)} {death_cause(a)}"
            if a.ended_at is not None
            else f"; {_stopping(run, a)}" + ("" if self_launched(run, a) else " (no restart left)")
        )
    left = [x for x in run.workers.values() if x.attempt == a.n and x.alive] if a.ended_at is not None else []
    if left:
        # torchrun died without stopping them (SIGKILL): they still hold their memory and ports.
        who = ", ".join(f"rank {x.rank} (pid {x.pid})" for x in sorted(left, key=lambda x: x.rank))
        then += f"; still running: {who}: kill them before a resume"
    head = f"attempt {a.n} {cause}" if w is None else f"attempt {a.n}: {cause}"
    unwatched = unwatched_checkpoints(run, a) if verified is None and a.ended_at is not None else []
    message = f"{head} {lost_txt}" + (f" ({why})" if why else "") + oom_hint + then
    if unwatched:
        message += unwatched_words(unwatched)
    last_ckpt = max((c.step for c in run.checkpoints if c.step is not None), default=None)
    return Finding(
        code="DEAD",
        severity="critical",
        message=message,
        # Nothing verified to resume from: no resume offered (a checkpoint nobody watched is named).
        action=None if unwatched else "resume",
        key=f"attempt-{a.n}",
        evidence={
            "attempt": a.n,
            "exit_code": a.exit_code,
            "exit_signal": a.exit_signal,
            "signal": signal_name(a.exit_signal) if a.exit_signal is not None else None,
            "error": a.error,
            "last_step": a.last_step,
            "steps_lost": lost,
            "last_verified_step": verified.step if verified is not None else None,
            "last_verified_path": verified.path if verified is not None else None,
            "last_checkpoint_step": last_ckpt,
            "ended_at": a.ended_at,
            # The rank whose end took the attempt down (None: no worker failed first).
            "rank": w.rank if w is not None else None,
            "worker": _worker_evidence(w) if w is not None else None,
            "unwatched_checkpoints": unwatched,
            "cause_from": cause_from(w, crash),
        },
    )


_WORKER_SOURCES = {
    "wait-status": "the rank's own exit status",
    "launcher": "the launcher's failure summary in trainer.log",
    "gone": "the process probes (it was gone, how not known)",
}


def cause_from(w: WorkerView | None, crash: p.Crash | None) -> str:
    """Where a death's cause was read, in words (DEAD's evidence `cause_from`)."""
    if w is not None:
        return _WORKER_SOURCES.get(w.end_source or "gone", str(w.end_source))
    if crash is not None and crash.chain:
        if crash.source == "reporter":
            return "the trainer's reporter (the exception it raised)"
        return "the last traceback in trainer.log after the attempt's last step"
    return "the trainer's exit status"


def _worker_evidence(w: WorkerView) -> dict[str, object]:
    return {
        "rank": w.rank,
        "pid": w.pid,
        "exit_code": w.exit_code,
        "exit_signal": w.exit_signal,
        "signal": signal_name(w.exit_signal) if w.exit_signal is not None else None,
        "source": w.end_source,
        "ended_at": w.ended_at,
    }

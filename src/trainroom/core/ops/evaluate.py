"""Promotion gated by the trainer's own evaluation: the `[eval]` command template runs on a verified
candidate (its path as {ckpt}) at low priority with a timeout, the figure is read from its output,
and the candidate passes when the figure is finite and not worse than the best promoted one by more
than the margin. The keeper's checkpoint pipeline calls `evaluate` from a worker thread; `trainroom
eval` calls it to re-evaluate a promoted checkpoint and compare with the figure recorded for it.

The evaluation is the trainer's code: it runs in its own session (its whole process group is killed
at the timeout), under SCHED_IDLE (else nice 19) so it takes only the CPU the trainer leaves, with stdin closed and its output
read bounded (the last 64 KiB: the figure is what it prints last)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping

import msgspec

from trainroom.core.configuration.config import Eval
from trainroom.core.ops.figures import find_figure
from trainroom.core.ops.resume import resume_argv
from trainroom.core.run.ended import returncode_ended
from trainroom.core.wire import protocol as p

TAIL_BYTES = 64 * 1024
NICE = 19
# Seconds between SIGTERM and SIGKILL of an evaluation past its timeout.
KILL_GRACE_S = 5.0


def figure_in(text: str, pattern: str | None = None) -> float | None:
    """The figure an evaluation printed (ops.figures: linear time on bounded lines; with no
    pattern, the evaluation's own loss by name precedence); None when none is found. Non-finite
    figures are returned as they are (nan, inf): a NaN evaluation is a verdict, not a missing
    figure."""
    found = find_figure(text, pattern)
    return found.value if found is not None else None


# A figure better than the median of the run's other figures by more than this many times their
# scale (the larger of |median| and their spread) is implausible: it is held back, never the best.
PLAUSIBLE_K = 10.0


def implausible(figure: float, history: list[float], policy: Eval) -> str | None:
    """Why `figure` is implausible beside the run's other figures (None: it is plausible, or there
    is nothing to judge it by). Only the too-good side: a bogus low loss (-1e9) would otherwise
    become the best and hold every later checkpoint back; a bad figure is judged by the margin."""
    others = [h for h in history if math.isfinite(h)]
    if not others:
        return None
    med = statistics.median(others)
    scale = max(abs(med), max(others) - min(others), 1e-12)
    bound = med - PLAUSIBLE_K * scale if policy.lower_is_better else med + PLAUSIBLE_K * scale
    if (figure < bound) if policy.lower_is_better else (figure > bound):
        return (
            f"evaluated {figure:.4g}, implausible beside this run's {len(others)} other figure(s) "
            f"(median {med:.4g}; beyond {bound:.4g}): not taken as the best"
        )
    return None


def judge(
    figure: float | None, best: float | None, policy: Eval, history: list[float] | None = None
) -> tuple[bool, str]:
    """Whether a candidate with this figure may be promoted, and why, in words. `history`: the
    run's earlier figures (passed or held), for plausibility."""
    if figure is None:
        return False, "its evaluation printed no figure"
    if not math.isfinite(figure):
        return False, f"its evaluation gave {figure}"
    odd = implausible(figure, history or [], policy)
    if odd is not None:
        return False, odd
    if best is not None:
        rest = list(history or [])
        with contextlib.suppress(ValueError):
            rest.remove(best)
        if implausible(best, [*rest, figure], policy) is not None:
            return True, (
                f"evaluated {figure:.4g}; the best promoted figure {best:.4g} is implausible beside this "
                "run's other figures, so it is not held against it"
            )
    if best is None:
        return True, f"evaluated {figure:.4g}, the first figure of this run"
    margin = abs(best) * policy.margin
    if policy.lower_is_better:
        bound, worse = best + margin, figure > best + margin
    else:
        bound, worse = best - margin, figure < best - margin
    pct = f"{policy.margin * 100:.3g} %"
    if worse:
        return (
            False,
            f"evaluated {figure:.4g}, worse than the best promoted {best:.4g} by more than {pct} (bound {bound:.4g})",
        )
    return True, f"evaluated {figure:.4g}, within {pct} of the best promoted {best:.4g}"


def better(a: float, b: float | None, policy: Eval) -> bool:
    """Whether figure a is better than b (None: there is none yet)."""
    return b is None or (a < b if policy.lower_is_better else a > b)


def evaluate(
    policy: Eval,
    ckpt: str,
    *,
    step: int | None,
    run_id: str,
    cwd: str,
    best: float | None,
    env: Mapping[str, str] | None = None,
    history: list[float] | None = None,
) -> p.EvalFigure:
    """Run the evaluation on one checkpoint and judge its figure against `best`. Blocks (a worker
    thread's call); never raises for what the evaluation does: a failure is a held verdict."""
    assert policy.command is not None
    argv = resume_argv(policy.command, ckpt=ckpt, step=step, run_id=run_id)
    t0 = time.monotonic()
    ran = Ran()
    code, out, timed_out = run_bounded(
        argv, cwd, dict(env if env is not None else os.environ), policy.timeout_s, ran=ran
    )
    seconds = round(time.monotonic() - t0, 3)
    base = p.EvalFigure(
        command=policy.command, pattern=policy.pattern, leftovers=ran.leftovers, seconds=seconds
    )
    if code is None:
        return msgspec.structs.replace(base, why=f"its evaluation {out.removeprefix('it ')}")
    if timed_out:
        return msgspec.structs.replace(
            base, why=f"its evaluation ran past {policy.timeout_s:.0f} s and was killed"
        )
    found = find_figure(out, policy.pattern)
    figure = found.value if found is not None else None
    if code != 0:
        last = _last_line(out)
        return msgspec.structs.replace(
            base,
            why=f"its evaluation failed ({returncode_ended(code)})" + (f": {last}" if last else ""),
            exit_code=code,
        )
    passed, why = judge(figure, best, policy, history)
    return msgspec.structs.replace(
        base,
        figure=figure if figure is not None and math.isfinite(figure) else None,
        passed=passed,
        why=why,
        best=best,
        exit_code=code,
        figure_name=found.name if found is not None else None,
    )


class Ran:
    """What run_bounded saw beyond the exit: the processes its command left behind (killed)."""

    leftovers: int = 0


def run_bounded(
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    timeout_s: float,
    *,
    idle: bool = True,
    ran: Ran | None = None,
) -> tuple[int | None, str, bool]:
    """(exit code, the output's tail, timed out); code None: it could not start (the text says why).
    The output goes to an unnamed file, so however much it prints only its tail is read. It runs
    in a session of its own: whatever it leaves behind in that session when it ends (a data
    loader's workers, a server it started) is killed, and counted in `ran`."""
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_lower_priority if idle else None,  # only os.nice, before exec
            )
        except OSError as exc:
            return None, f"it could not start: {argv[0]}: {exc.strerror or exc}", False
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        left = _kill_session(proc.pid)
        if ran is not None:
            ran.leftovers = left
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - TAIL_BYTES))
        text = out.read().decode("utf-8", errors="replace")
    return proc.returncode, text, timed_out


def _lower_priority() -> None:
    """SCHED_IDLE where the kernel has it (the evaluation runs only on CPU time nothing else
    wants, so it cannot slow the trainer's steps), else nice 19."""
    os.nice(NICE)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the evaluation's own session (it was started in one), SIGKILL after the grace."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _session_members(sid: int, proc_root: str = "/proc") -> list[int]:
    """The live processes of session `sid` (field 6 of /proc/PID/stat), zombies left out."""
    out: list[int] = []
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc_root}/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 3 and fields[0] != b"Z" and int(fields[3]) == sid:
            out.append(int(name))
    return out


def _kill_session(sid: int) -> int:
    """SIGKILL what is left of the session the evaluation was the leader of; how many."""
    left = [pid for pid in _session_members(sid) if pid != os.getpid()]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(left)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""

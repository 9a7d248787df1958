"""Life: an attempt that ended is `exited` (0, no signal) or `dead` with its cause, the step it
died at and what was lost since the last verified checkpoint. DEAD comes from the keeper's
waitpid (or a pidfd that says the process is gone), never from silence (seed 001: log age detects
slowness, absence detects death)."""

from __future__ import annotations

import signal

from trainroom.core.findings import Finding
from trainroom.core.health.context import WatchContext
from trainroom.core.run.state import AttemptView, RunState
from trainroom.core.units import fmt_bytes, signal_name


def ended_verdict(run: RunState, a: AttemptView, ctx: WatchContext) -> tuple[str, str, list[Finding]]:
    at = f" at step {a.last_step}" if a.last_step is not None else ""
    if a.exit_code == 0 and a.exit_signal is None and a.error is None:
        return "exited", f"attempt {a.n} exited 0{at}", []
    if a.stopped:
        # The user's own kill: said as such, no DEAD, nothing to resume automatically.
        return "stopped", f"attempt {a.n} stopped by {a.stop_by}{at} ({death_cause(a)})", []
    return "dead", death_cause(a), [dead_finding(run, a, ctx)]


def death_cause(a: AttemptView) -> str:
    if a.error:
        return a.error
    if a.exit_signal is not None:
        return f"killed by {signal_name(a.exit_signal)}"
    if a.exit_code is not None:
        code = a.exit_code
        if code > 128 and 1 <= code - 128 < 65:
            return f"exit code {code} (128+{signal_name(code - 128)}, through a shell)"
        return f"exit code {code}"
    return "process gone, exit status not yet known"


def _lost(run: RunState, a: AttemptView) -> tuple[str, int | None]:
    """Where the attempt died and how many steps are lost since the last verified checkpoint
    (or, without one, since the attempt's first step)."""
    verified = run.last_verified()
    if a.last_step is None:
        return "before its first step", None
    if verified is not None and verified.step is not None:
        lost = max(0, a.last_step - verified.step)
        return (
            f"at step {a.last_step}; {lost} steps lost since the last verified checkpoint (step {verified.step})",
            lost,
        )
    start = a.first_step - 1 if a.first_step is not None else None
    lost_or_none = a.last_step - start if start is not None else None
    more = f", {lost_or_none} steps of this attempt lost" if lost_or_none is not None else ""
    return f"at step {a.last_step}; no verified checkpoint{more}", lost_or_none


def dead_finding(run: RunState, a: AttemptView, ctx: WatchContext) -> Finding:
    """DEAD: the cause, the last step, and what was lost since the last verified checkpoint."""
    cause = death_cause(a)
    crash = a.crash or ctx.log_crash
    verified = run.last_verified()
    lost_txt, lost = _lost(run, a)
    if crash is not None and crash.chain:
        inner = crash.chain[-1]
        why = f"{inner.type}: {inner.message}"
    elif a.exit_signal is not None:
        why = "no traceback"
    else:
        why = ""
    oom_hint = ""
    avail = ctx.host.effective_available_bytes if ctx.host is not None else None
    if a.exit_signal == signal.SIGKILL and avail is not None and avail < ctx.thresholds.host_ram_low_bytes:
        oom_hint = f"; host RAM was low ({fmt_bytes(avail)} available): the OOM killer is a suspect"
    message = f"attempt {a.n} {cause} {lost_txt}" + (f" ({why})" if why else "") + oom_hint
    last_ckpt = max((c.step for c in run.checkpoints if c.step is not None), default=None)
    return Finding(
        code="DEAD",
        severity="critical",
        message=message,
        action="resume",
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
        },
    )

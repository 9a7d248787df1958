"""Crash causes: the last traceback of a trainer's log as a Crash (for an uninstrumented trainer),
MASKED_ERROR (an outer error hiding the innermost one: scenario 13's `SystemError: readinto` over
`OSError: [Errno 12] Cannot allocate memory`) and REPEAT_DEATH (two deaths in one region of
training). One MASKED_ERROR rule serves the watchdog (an attempt's crash) and the checkpoint
verifier (a load that fails)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence

import msgspec

from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.health.life import death_cause
from trainroom.core.logs.loglines import tqdm_bar
from trainroom.core.run.state import RunState
from trainroom.core.units import errno_name
from trainroom.core.wire import protocol as p

# --------------------------------------------------------------------------- MASKED_ERROR


def _first_line(s: str, limit: int = 200) -> str:
    line = s.strip().splitlines()[0] if s.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def masked_error(
    chain: Sequence[p.ErrorLink | Mapping[str, object]],
    during: str = "",
    key: str = "",
    *,
    fatal: bool = True,
    source: str | None = None,
    attempt: int | None = None,
) -> Finding | None:
    """MASKED_ERROR: the outermost error of a chain (outermost first, as `protocol.error_chain`
    and a journaled report give it) hides an innermost error of another kind, another type or
    errno; a re-raise of the same kind with more words is not a mask. An innermost ENOMEM (or
    MemoryError) suggests reclaiming host RAM.

    Severity: critical when the error is fatal, that is what ended the attempt (the crash of an
    attempt that has exited) or what blocks a resume (a checkpoint whose load fails with it): the
    outer text would send whoever reads it after the wrong cause. A warning while the attempt that
    reported it still runs, since a traceback a trainer caught and printed may not be what stops
    it. `during` names the operation ("torch.load step-000300.pt") and prefixes the message.
    """
    links = [x if isinstance(x, p.ErrorLink) else msgspec.convert(x, p.ErrorLink) for x in chain]
    if len(links) < 2:
        return None
    outer, inner = links[0], links[-1]
    if (outer.type, outer.errno) == (inner.type, inner.errno):
        return None
    en = errno_name(inner.errno, inner.errno_name)
    enomem = en == "ENOMEM" or inner.type == "MemoryError"
    inner_txt = f"{inner.type}: {_first_line(inner.message)}" + (f" ({en})" if en else "")
    outer_txt = f"{outer.type}: {_first_line(outer.message)}" if outer.message.strip() else outer.type
    advice = "; host RAM ran out: reclaim the page cache before a resume" if enomem else ""
    return Finding(
        code="MASKED_ERROR",
        severity="critical" if fatal else "warning",
        action="reclaim" if enomem else None,
        key=key or during,
        message=(f"{during}: " if during else "") + f"`{outer_txt}` hides `{inner_txt}`{advice}",
        evidence={
            "outer": msgspec.to_builtins(outer),
            "inner": msgspec.to_builtins(inner),
            "chain": [f"{x.type}: {x.message}" for x in links],
            "errno_name": en,
            "during": during or None,
            "source": source,
            "attempt": attempt,
        },
    )


def attempt_masked_error(run: RunState, log_crash: p.Crash | None) -> Finding | None:
    """MASKED_ERROR of the current attempt's crash (the reporter's, else the log's traceback):
    fatal once the attempt has ended."""
    a = run.attempt
    crash = (a.crash or log_crash) if a is not None else None
    if a is None or crash is None:
        return None
    return masked_error(
        crash.chain, key=f"attempt-{a.n}", fatal=a.ended_at is not None, source=crash.source, attempt=a.n
    )


# --------------------------------------------------------------------------- tracebacks in a log

_HEADER_TEXT = "Traceback (most recent call last):"
_TB_HEAD = re.compile(r"^Traceback \(most recent call last\):\s*$")
_CHAIN = {
    "The above exception was the direct cause of the following exception:": "cause",
    "During handling of the above exception, another exception occurred:": "context",
}
_PREFIX = re.compile(r"^\[(?:rank|default)\d{1,9}+\]:\s?")  # torchrun's per-rank line prefix
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]{0,255}+)(?::\s?(?P<msg>.*))?$")
_EXC_WORDS = ("Error", "Exception", "Interrupt", "Exit")
_ERRNO = re.compile(r"\[Errno (?P<n>-?\d{1,9}+)\]")
# torch elastic's own exception once a worker failed: what the launcher says, not the cause.
_LAUNCHER_ERROR = "ChildFailedError"
# A line another writer logged (a launcher's timestamped or glog line, a `logging` record): it
# ends an exception's message even without a blank line between them.
_LOG_LINE = re.compile(
    r"^(?:\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d|[WEIF]\d{4} \d\d:\d\d:\d\d|"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]*:)"
)


def _parse_block(
    lines: list[str], head: int, prefixed: list[bool] | None = None
) -> tuple[p.ErrorLink | None, int]:
    """The exception line(s) after the frames of the traceback starting at `head` (or, for a
    cause printed without a traceback, the exception line at `head` itself); and the index just
    past the block. A message's continuation lines stop at a blank line, another traceback, a
    chain sentence, another writer's log line, a progress bar, or a line whose rank prefix differs from the
    exception line's (torchrun's own lines carry none)."""
    i = head + 1 if _TB_HEAD.match(lines[head]) else head
    n = len(lines)
    while i < n and (lines[i].startswith(" ") or lines[i].startswith("\t")):
        i += 1
    if i >= n:
        return None, i
    m = _EXC_LINE.match(lines[i])
    if m is None:
        return None, i + 1
    msg_lines = [m.group("msg") or ""]
    j = i + 1
    while (
        j < n
        and lines[j].strip()
        and not _TB_HEAD.match(lines[j])
        and lines[j].strip() not in _CHAIN
        and not _LOG_LINE.match(lines[j])
        and tqdm_bar(lines[j]) is None  # a progress bar's redraw (tqdm closing its bar)
        and (prefixed is None or prefixed[j] == prefixed[i])
    ):
        msg_lines.append(lines[j])
        j += 1
    message = "\n".join(msg_lines).strip()
    link = p.ErrorLink(type=m.group("type"), message=message)
    em = _ERRNO.search(message)
    if em is not None:
        code = int(em.group("n"))
        link = p.ErrorLink(type=link.type, message=message, errno=code, errno_name=errno_name(code))
    return link, j


def _block_above(lines: list[str], k: int) -> int | None:
    """Where the exception printed above the chain sentence at `k` starts: its traceback's
    header, or its own line when it was never raised (`raise X from OSError(12, ...)` prints the
    cause without a traceback). None when nothing exception-like is there."""
    e = k - 1
    while e >= 0 and not lines[e].strip():
        e -= 1
    s = e
    # Up through the message's lines to the exception line: a frame line or a header above it
    # means a traceback; a blank line or the start means it stands alone.
    while (
        s >= 0 and lines[s].strip() and not lines[s].startswith((" ", "\t")) and not _TB_HEAD.match(lines[s])
    ):
        s -= 1
    if s >= 0 and (lines[s].startswith((" ", "\t")) or _TB_HEAD.match(lines[s])):
        h = s
        while h >= 0 and not _TB_HEAD.match(lines[h]):
            h -= 1
        return h if h >= 0 else None
    for i in range(e, s, -1):  # the nearest line above that names an exception type
        m = _EXC_LINE.match(lines[i])
        if m is not None and m.group("type").endswith(_EXC_WORDS):
            return i
    return None


def crash_from_log(text: str, t: float | None = None) -> p.Crash | None:
    """The last Python traceback in a trainer log as a Crash (outermost link first), following the
    "direct cause" and "During handling" chain back to its innermost error; None if there is none.
    torchrun's ChildFailedError (its report of a failed worker) is passed over for the worker's
    own traceback before it. `t` stamps the Crash (default: now)."""
    raw = [_from_header(ln.rstrip("\r")) for ln in text.splitlines()]
    prefixed = [_PREFIX.match(ln) is not None for ln in raw]
    lines = [_PREFIX.sub("", ln) for ln in raw]
    heads = [i for i, ln in enumerate(lines) if _TB_HEAD.match(ln)]
    link: p.ErrorLink | None = None
    last = end = -1
    while heads:
        last = heads.pop()
        link, end = _parse_block(lines, last, prefixed)
        if link is None or not link.type.endswith(_LAUNCHER_ERROR):
            break
        link = None  # torchrun's report that a worker failed: the worker's own is the cause
    if link is None:
        return None
    heads.append(last)
    chain = [link]
    first = last
    # Walk back: a chain sentence right above this traceback joins the one before it.
    while True:
        k = first - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k < 0 or lines[k].strip() not in _CHAIN:
            break
        start = _block_above(lines, k)
        if start is None:
            break
        prev_link, _ = _parse_block(lines, start, prefixed)
        if prev_link is None:
            break
        chain.append(prev_link)
        first = start
    return p.Crash(
        t=time.time() if t is None else t,
        chain=p.unwrap_workers(chain)[:64],
        traceback="\n".join(lines[first:end]),
        source="log",
    )


def _from_header(line: str) -> str:
    """A traceback's header printed after other text on its line (a progress bar's last redraw:
    `...11.29it/s]Traceback (most recent call last):`) starts its own line; a DataLoader worker's
    `Original Traceback` inside a message is not a header."""
    at = line.find(_HEADER_TEXT, 1)
    if at < 0 or line[:at].endswith("Original "):
        return line
    return line[at:]


# --------------------------------------------------------------------------- REPEAT_DEATH


def repeat_death(run: RunState, th: Thresholds) -> Finding | None:
    """REPEAT_DEATH: the last two deaths within the window of the same step (an attempt a user
    stopped with `trainroom kill` is not a death). Cleared once a later attempt gets past that
    region."""
    dead = [
        a
        for a in run.attempts
        if a.ended_at is not None
        and a.last_step is not None
        and a.error is None
        and not (a.exit_code == 0 and a.exit_signal is None)
        and not a.stopped  # a user's `trainroom kill` is a stop, not a death
    ]
    if len(dead) < 2:
        return None
    last, prev = dead[-1], dead[-2]
    assert last.last_step is not None and prev.last_step is not None
    if abs(last.last_step - prev.last_step) > th.repeat_death_window_steps:
        return None
    cur = run.attempt
    region_end = max(last.last_step, prev.last_step) + th.repeat_death_window_steps
    if cur is not None and cur.n > last.n and cur.last_step is not None and cur.last_step > region_end:
        return None
    return Finding(
        code="REPEAT_DEATH",
        severity="warning",
        message=(
            f"attempts {prev.n} and {last.n} both died near step {last.last_step} ({prev.last_step} and "
            f"{last.last_step}, within {th.repeat_death_window_steps} steps): once is bad luck, twice in the "
            "same place is a pattern in that region of training (a batch, a shard, the schedule)"
        ),
        key=f"step-{last.last_step}",
        evidence={
            "attempts": [prev.n, last.n],
            "steps": [prev.last_step, last.last_step],
            "window_steps": th.repeat_death_window_steps,
            "causes": [death_cause(prev), death_cause(last)],
        },
    )

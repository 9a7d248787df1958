"""`trainroom status` as text: a few lines a human reads, from the `status --json` dict (so the
text can never say something the JSON does not)."""

from __future__ import annotations

import re
from typing import Any

from trainroom.core.logs.loglines import NOT_STEPS
from trainroom.core.logs.logtiming import RATE_WORDS
from trainroom.core.run.ended import how_ended
from trainroom.core.run.status import damage_words
from trainroom.core.units import fmt_bytes, fmt_duration

# Escape sequences (CSI: colours, clear screen; OSC: window title, hyperlinks) and the other
# control characters: a trainer's text reaches a terminal through these lines, never as commands.
_CONTROLS = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]?|[\x00-\x08\x0b-\x1f\x7f\x9b]"
)


def printable(text: str) -> str:
    """`text` without terminal escape sequences and control characters (newlines and tabs kept)."""
    return _CONTROLS.sub("", text)


def status_lines(d: dict[str, Any]) -> list[str]:
    ex = d["exit"]
    end = (
        f" ({how_ended(ex['code'], ex['signal'])})"
        if ex["signal"] is not None or ex["code"] is not None
        else ""
    )
    loss = d["loss"]
    loss_s = f"{loss:.4f}" if isinstance(loss, float) else str(loss)
    lr = d["lr"]
    eff = lr["effective"][0] if lr["effective"] else None
    lines = [
        f"{d['run']}  {d['state'].upper()}{end}  attempt {d['attempt']}  pid {d['pid']}"
        + ("  attached" if d.get("attached") else "")
        + f"  keeper {d['keeper']}",
        f"  step {d['step']}  {_pace(d)}  loss {loss_s}  lr {_fig(eff, '.3g')} (asked {_fig(lr['requested'], '.3g')})",
    ]
    log = d.get("log") or {}
    if log.get("unit") in NOT_STEPS:  # the step is a count of something else: said beside it
        lines[1] = lines[1].replace(f"step {d['step']} ", f"step {d['step']} ({log['unit']}) ", 1)
    if log.get("unrecognised"):
        lines.append(f"  {log['unrecognised']}")
    if d["keeper"] != "alive" and d.get("state_reason"):
        lines.append(f"  {d['state_reason']}")  # what the journal cannot say: read from /proc
    v = d["vram"]
    if v["driver_available"]:
        # The device's use and the run's own (per process), named apart: the control room's
        # VRAM panel says the same two figures.
        run = v.get("driver_run_bytes")
        lines.append(
            f"  vram device {fmt_bytes(v['driver_used_bytes'])} of {fmt_bytes(v['driver_total_bytes'])} used"
            + (f", this run {fmt_bytes(run)}" if run is not None else "")
            + f"  allocator {fmt_bytes(v['allocator_reserved_bytes'])}"
        )
    else:
        lines.append(f"  {v['driver_reason'] or 'driver view unavailable: not probed yet'}")
    h = d["host"]
    if h["mem_available_bytes"] is not None:
        lines.append(
            f"  host available {fmt_bytes(h['mem_available_bytes'])}  page cache "
            f"{fmt_bytes(h['page_cache_bytes'])}  {_disk(d['disk'])}"
        )
    if d.get("journal_damage"):
        lines.append("  " + damage_words(d["journal_damage"]))
    lines += finding_lines(d)
    return [printable(line) for line in lines]


def finding_lines(d: dict[str, Any]) -> list[str]:
    """The open findings as rows: a root cause, then what follows from it indented under it with
    its count; the repeats of one code one line (a status of a version without rows: one a line)."""
    rows = d.get("finding_rows")
    if rows is None:
        return [
            f"  {f['severity'].upper():8} {f['code']}: {f['message']}"
            + (f" [{f['action']}]" if f["action"] else "")
            for f in d["findings"]
        ]
    out = []
    for r in rows:
        key = f" [{r['action']}]" if r["action"] else ""
        out.append(f"  {r['severity'].upper():8} {r['code']}: {r['text']}{key}")
        out += [f"  {'':8}   ↳ {k['severity'].upper()} {k['text']}" for k in r["consequences"]]
    return out


def _disk(disk: dict[str, Any]) -> str:
    """The checkpoint root's figures: under a budget, the budget's and the filesystem's apart."""
    budget = disk.get("budget_bytes")
    if not budget:
        return f"disk {_fig(disk['used_fraction'], '.0%')} used"
    fs = disk.get("filesystem_used_fraction")
    return f"budget {_fig(disk['used_fraction'], '.0%')} used (of {fmt_bytes(budget)})" + (
        f"  disk {_fig(fs, '.0%')} used" if fs is not None else ""
    )


def _pace(d: dict[str, Any]) -> str:
    """The last step's age and the pace, as the control room's cadence panel says them: live
    while steps come; "was" once they stopped coming (hung, stalled, ended), and for an attempt
    that ended, its last step's distance from the end and how long ago the end was."""
    last = d.get("steps_per_s_last", d["steps_per_s"])
    ended = d.get("ended_s_ago")
    source = RATE_WORDS.get(d.get("steps_per_s_from") or "")
    of = f" ({source})" if source and last is not None else ""
    if isinstance(ended, (int, float)):
        age = d["step_age_s"]
        before = f"last step {_fig(age, '.1f')} s before the end" if age is not None else "no step"
        return f"ended {fmt_duration(ended)} ago, {before}  was {_rate(last)} steps/s{of}"
    if d["steps_per_s"] is None and last is not None:
        return f"age {_fig(d['step_age_s'], '.1f')} s  was {_rate(last)} steps/s{of}"
    return f"age {_fig(d['step_age_s'], '.1f')} s  {_rate(d['steps_per_s'])} steps/s{of}"


def _rate(x: Any) -> str:
    """Steps a second to a tenth (7.7, 11.0), two figures under one (0.74); "?" when unknown."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return "?"
    return f"{x:.1f}" if x >= 1 else f"{x:.2g}"


def _fig(x: Any, spec: str) -> str:
    """A figure rounded for a person (`disk 29%`, `13.5 steps/s`); "?" when unknown."""
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"

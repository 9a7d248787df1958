"""A volatile finding's words with the figures of now. The watchdog pins a volatile finding's
words while its cause, severity and fix stay (health.watchdog `_pin`), so the journal is not
rewritten each tick; its evidence keeps moving and reaches clients at most once a second (the
keeper's FINDING_REFRESH_S), with `last_seen` the time it was measured. Every view (`status`,
the control room's findings, header and detail) shows the words through `now_findings`, so a
STALLED row says the gap of now, not of when it opened, and a SLOW or HOST_RAM_LOW row the ratio
and the GiB its evidence last measured. A time figure ages with the reader's clock since
`last_seen` only while a keeper is watching (`now` given); a journal read as the keeper left it
says the figures it last measured. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import msgspec

from trainroom.core.findings import Finding
from trainroom.core.units import fmt_bytes, fmt_duration

# What units.fmt_duration and units.fmt_bytes write: "0.4 s", "12 s", "3m07s", "2h05m", "3d04h";
# "615 MiB", "2.1 GiB", "0 B".
_DUR = r"(?:\d+(?:\.\d+)? s|\d+m\d+s|\d+h\d+m|\d+d\d+h)"
_SIZE = r"(?:[\d.]+ (?:[KMGTPE]i)?B)"
# STALLED / HUNG by their evidence's cause: (the figure's key, the words around it).
_AGES: dict[str, tuple[str, re.Pattern[str], str]] = {
    "no-step": ("gap_s", re.compile(rf"no step for {_DUR}"), "no step for {}"),
    "silent": (
        "silent_s",
        re.compile(rf"no heartbeat \(nor step\) for {_DUR}"),
        "no heartbeat (nor step) for {}",
    ),
    "phase": ("phase_s", re.compile(rf"phase for {_DUR}, over"), "phase for {}, over"),
}
_SLOW = re.compile(r"steps slowed [\d.]+x: the last (\d+) took [\d.]+-[\d.]+ s against a median of [\d.]+ s")
_RAM = re.compile(rf"RAM low: {_SIZE} available")
_CACHE = re.compile(rf"{_SIZE} in the page cache")


def _num(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def _age(f: Finding, now: float | None) -> str:
    cause = str(f.evidence.get("cause", ""))
    if cause not in _AGES:
        return f.message
    key, pattern, words = _AGES[cause]
    seconds = _num(f.evidence.get(key))
    if seconds is None:
        return f.message
    if now is not None and f.last_seen:
        seconds += max(0.0, now - f.last_seen)  # measured at last_seen; it grows while nothing comes
    return pattern.sub(words.format(fmt_duration(seconds)), f.message, count=1)


def _slow(f: Finding, now: float | None) -> str:
    ev = f.evidence
    ratio, median, recent = _num(ev.get("ratio")), _num(ev.get("median_s")), ev.get("recent_s")
    if ratio is None or median is None or not isinstance(recent, list) or not recent:
        return f.message
    figures = [x for x in (_num(v) for v in recent) if x is not None]
    if len(figures) != len(recent):
        return f.message
    return _SLOW.sub(
        f"steps slowed {ratio:.1f}x: the last {len(figures)} took {min(figures):.2f}-{max(figures):.2f} s "
        f"against a median of {median:.2f} s",
        f.message,
        count=1,
    )


def _ram(f: Finding, now: float | None) -> str:
    message = f.message
    available, cache = f.evidence.get("available_bytes"), f.evidence.get("page_cache_bytes")
    if isinstance(available, int):
        message = _RAM.sub(f"RAM low: {fmt_bytes(available)} available", message, count=1)
    if isinstance(cache, int):
        message = _CACHE.sub(f"{fmt_bytes(cache)} in the page cache", message, count=1)
    return message


_WORDS: dict[str, Callable[[Finding, float | None], str]] = {
    "STALLED": _age,
    "HUNG": _age,
    "SLOW": _slow,
    "HOST_RAM_LOW": _ram,
}


def now_message(f: Finding, now: float | None) -> str:
    """`f`'s words with its figures of now (see the module); its own words when it has none."""
    words = _WORDS.get(f.code)
    return words(f, now) if words is not None else f.message


def now_findings(findings: Iterable[Finding], now: float | None) -> list[Finding]:
    """The findings, in their order, each with `now_message`'s words (copies: the run's own
    findings keep the keeper's)."""
    out = []
    for f in findings:
        said = now_message(f, now)
        out.append(f if said == f.message else msgspec.structs.replace(f, message=said))
    return out

"""Time every log pattern on hostile lines: each compiled pattern of the log recognisers
(core/logs/loglines, logshapes, logformats, logtiming, health/crash, probes/workers, the nanoGPT pattern), the
recognisers' own entry points (`tqdm_bar`, `metrics`, `pairs`, `Recognition.feed`,
`crash_from_log`), and, when it is present, the evaluation figure pattern (ops/evaluate `_FIGURE`),
on lines of 1 KiB to 1 MiB of digits, slashes, underscores and spaces (and a 20 KB URL).

Run it against this tree, then against main's code for the "before" column:

    python scripts/bench_patterns.py                        # this checkout's src/
    git archive main src | tar -x -C /tmp/tr-main && \\
        python scripts/bench_patterns.py --src /tmp/tr-main/src

A pattern whose time at one size passes --give-up seconds is not run at the larger sizes (a
quadratic one would take hours at 1 MiB): the table says `>` and the size it gave up after.
Each pattern is run the way its caller runs it (`search`/`match`/`finditer`/`sub`).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
from collections.abc import Callable
from typing import Any

SIZES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
SHAPES = {"digits": "1", "slashes": "/", "underscores": "_", "spaces": " "}
MODULES = [
    "trainroom.core.logs.loglines",
    "trainroom.core.logs.logshapes",
    "trainroom.core.logs.logformats",
    "trainroom.core.logs.logtiming",
    "trainroom.core.health.crash",
    "trainroom.core.probes.workers",
    "trainroom.core.ops.evaluate",
]


def hostile(shape: str, size: int) -> str:
    if shape == "url":
        return ("https://example.com/" + "a/b_c-d.e" * (size // 9))[:size]
    return SHAPES[shape] * size


def runners() -> dict[str, Callable[[str], Any]]:
    out: dict[str, Callable[[str], Any]] = {}
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        short = name.rsplit(".", 1)[-1]
        for attr, value in sorted(vars(mod).items()):
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                rx = value
                out[f"{short}.{attr}"] = lambda s, rx=rx: (
                    rx.match(s),
                    sum(1 for _ in rx.finditer(s)),
                )
    formats = importlib.import_module("trainroom.core.logs.logformats")
    nano = re.compile(formats.NANOGPT_PATTERN)
    out["logformats.NANOGPT_PATTERN"] = lambda s: nano.search("iter " + s)
    lines = importlib.import_module("trainroom.core.logs.loglines")
    shapes = importlib.import_module("trainroom.core.logs.logshapes")
    crash = importlib.import_module("trainroom.core.health.crash")
    out["loglines.metrics()"] = lines.metrics
    out["loglines.metrics() after `loss=`"] = lambda s: lines.metrics("loss=" + s)
    out["logshapes.pairs()"] = shapes.pairs
    if hasattr(lines, "tqdm_bar"):
        out["loglines.tqdm_bar()"] = lines.tqdm_bar

    def feed(s: str) -> object:
        r = formats.recognition(None)
        return r.feed(s), r.feed(" 50%|" + s + "| 1/2 [00:01<00:01, 1.0it/s, loss=1.5]")

    out["Recognition.feed() (all built-in)"] = feed
    try:
        timing = importlib.import_module("trainroom.core.logs.logtiming")
    except ImportError:
        timing = None  # a tree from before the trainer's own timing was read
    if timing is not None:
        out["logtiming.bar_rate()"] = lambda s: timing.bar_rate(s + "it/s")
        out["logtiming.iteration_ms()"] = lambda s: timing.iteration_ms(", time " + s + "ms")
        out["logtiming.leading_stamp()"] = lambda s: timing.leading_stamp("2026-12-04 10:00:00," + s)
    out["crash_from_log()"] = lambda s: crash.crash_from_log("Traceback (most recent call last):\n" + s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", help="the src/ directory whose trainroom to time (default: this checkout's)")
    ap.add_argument(
        "--give-up", type=float, default=1.0, help="seconds at one size before the larger are skipped"
    )
    ap.add_argument("--only", help="run only the patterns whose name contains this")
    args = ap.parse_args(argv)
    if args.src:
        sys.path.insert(0, args.src)
    import trainroom

    print(f"# trainroom from {trainroom.__file__}; seconds per line (`>` = gave up after the size shown)")
    sizes = [f"{s >> 10}K" for s in SIZES]
    print(f"{'pattern':40} {'line':12} " + " ".join(f"{s:>9}" for s in sizes))
    for name, fn in runners().items():
        if args.only and args.only not in name:
            continue
        for shape in [*SHAPES, "url"]:
            cells: list[str] = []
            gave_up = False
            for size in SIZES if shape != "url" else [20_000]:
                if gave_up:
                    cells.append(f"{'>':>9}")
                    continue
                line = hostile(shape, size)
                t0 = time.perf_counter()
                try:
                    fn(line)
                except Exception as exc:  # a pattern's caller that raises: said, not a crash
                    cells.append(f"{type(exc).__name__[:9]:>9}")
                    continue
                dt = time.perf_counter() - t0
                cells.append(f"{dt:9.4f}")
                gave_up = dt > args.give_up
            label = shape if shape != "url" else "url 20KB"
            print(f"{name[:40]:40} {label:12} " + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

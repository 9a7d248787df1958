"""How long reading an evaluation's figure takes on hostile output, before and after.

    python scripts/bench_figures.py [--json]

The old reader was one pattern over the whole output, `(?:^|[^A-Za-z0-9])(?:[A-Za-z_]*[ _])?loss…`,
quadratic on a run of word characters (70,000 underscores took 67.7 s in a keeper, holding the GIL).
The reader now (trainroom.core.ops.figures) searches bounded lines with bounded quantifiers. Each
hostile line is timed with both at sizes the old one finishes at, and with the new one at 1 MiB.
"""

from __future__ import annotations

import argparse
import json
import re
import time

from trainroom.core.ops.figures import find_figure

OLD = re.compile(
    r"""(?ix)
    (?:^|[^A-Za-z0-9])
    (?:[A-Za-z_]*[ _])?loss["']?
    \s*[:=]?\s*
    (?P<loss>[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))
    """
)
SHAPES = {
    "underscores": lambda n: "_" * n,
    "digits": lambda n: "9" * n,
    "a_ pairs": lambda n: "a_" * (n // 2),
    "loss + blanks": lambda n: "loss" + " " * n,
}


def _time(fn: object, text: str) -> float:
    t0 = time.perf_counter()
    fn(text)  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    for name, make in SHAPES.items():
        for n in (5_000, 10_000, 20_000):
            text = make(n)
            old = _time(lambda t: list(OLD.finditer(t)), text)
            new = _time(find_figure, text)
            rows.append({"shape": name, "chars": n, "old_s": round(old, 4), "new_s": round(new, 5)})
        text = make(1 << 20)
        rows.append(
            {"shape": name, "chars": 1 << 20, "old_s": None, "new_s": round(_time(find_figure, text), 4)}
        )
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'shape':<14} {'chars':>9} {'old (s)':>10} {'new (s)':>10}")
    for r in rows:
        old_s = f"{r['old_s']:.3f}" if r["old_s"] is not None else "(not run)"
        print(f"{r['shape']:<14} {r['chars']:>9} {old_s:>10} {r['new_s']:>10.4f}")


if __name__ == "__main__":
    main()

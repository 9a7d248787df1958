"""`trainroom demo` ends by itself unless asked to run on (`--forever`), and always after its fault."""

from __future__ import annotations

import argparse

from trainroom.core.demo.launcher import DEMO_STEPS, DEMO_STEPS_PAST_FAULT, add_demo_parser, demo_command


def _steps(*argv: str) -> int:
    ap = argparse.ArgumentParser()
    add_demo_parser(ap.add_subparsers(), lambda _a: 0)
    cmd = demo_command(ap.parse_args(["demo", *argv]))
    return int(cmd[cmd.index("--steps") + 1])


def test_the_demo_trains_a_bounded_number_of_steps_by_default() -> None:
    assert _steps() == DEMO_STEPS
    assert _steps("--fault", "nan") == DEMO_STEPS  # its fault (step 30 by default) plays out well before


def test_a_late_fault_step_moves_the_end_past_it() -> None:
    assert _steps("--fault", "spike", "--fault-step", str(DEMO_STEPS)) == DEMO_STEPS + DEMO_STEPS_PAST_FAULT


def test_steps_and_forever_say_otherwise() -> None:
    assert _steps("--steps", "40") == 40
    assert _steps("--forever") > 10**9

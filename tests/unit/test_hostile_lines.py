"""Trainer output is hostile data: every log pattern (core/logs/loglines, logshapes, logformats,
health/crash, probes/workers) is given 1 MiB lines of digits, slashes, underscores, spaces and a
long URL, and still gives the right answer (the time each takes is scripts/bench_patterns.py's
table, never asserted here); the keeper's reader (keeper/logtail) reads a bounded prefix of each
line, reads an unfinished line once, and leaves what its time budget does not cover for the next
tick."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainroom.core.health.crash import crash_from_log
from trainroom.core.keeper.logtail import MAX_LINE_BYTES, LogTail
from trainroom.core.logs.logformats import LogStep, Recognition, recognition
from trainroom.core.logs.loglines import metrics, number, tqdm_bar
from trainroom.core.logs.logshapes import pairs
from trainroom.core.probes.workers import launcher_reports, prefixed_rank

MiB = 1 << 20
HOSTILE = {
    "digits": "1" * MiB,
    "slashes": "/" * MiB,
    "underscores": "_" * MiB,
    "spaces": " " * MiB,
    "word-slashes": "a/" * (MiB // 2),
    "url": "https://example.com/" + "a/b_c-d.e" * (MiB // 9),
}


@pytest.mark.parametrize("shape", list(HOSTILE))
def test_each_pattern_reads_a_mebibyte_hostile_line_right(shape: str) -> None:
    junk = HOSTILE[shape]
    assert tqdm_bar(junk) is None
    assert metrics(junk) == {}
    assert pairs(junk) == {}
    assert number(junk) is None
    # A real bar or pair after the junk is still found.
    bar = tqdm_bar(junk + " 45%|####5     | 45/100 [00:01<00:02, 12.3it/s, loss=2.31, lr=3e-4]")
    assert bar is not None and (bar.n, bar.total) == (45, 100)
    assert metrics(bar.rest) == {"loss": 2.31, "lr": 3e-4}
    assert metrics(junk + " loss=2.5") == {"loss": 2.5}
    assert pairs(junk + " step 7 loss 2.5") == {"step": 7.0, "loss": 2.5}
    # Every built-in recogniser: nothing read from the junk, the next real line read.
    r = recognition(None)
    assert r.feed(junk) == []
    assert r.feed("iter " + junk) == []
    assert r.feed("Epoch 1 " + junk + "━━ 3/9 0:00:01 train_loss: 2.0") == []
    assert r.feed("step 3 loss 2.5") == [LogStep(3, 2.5)]
    assert r.errors == 0, r.last_error
    # A traceback whose message is the junk: the cause is still read.
    crash = crash_from_log(f'Traceback (most recent call last):\n  File "t.py", line 1\nValueError: {junk}\n')
    assert crash is not None and crash.chain[0].type == "ValueError"
    assert prefixed_rank([f"[rank{junk}]: x"]) is None
    assert launcher_reports(f"  rank      : {junk} (local_rank: 0)\n  exitcode  : {junk} (pid: 7)\n") == []


def test_implausibly_long_numbers_are_not_read() -> None:
    """Digits past the cap (24; `int()` refuses over 4300) are not a count or a figure."""
    big = "9" * 5000
    r = recognition(None)
    steps = r.feed(f"iter {big}: loss 2.0") + r.feed(f"step {big} loss 2.0")
    assert all(s.step < 10**6 for s in steps), steps  # (the loss may count as the next line's step)
    assert r.errors == 0, r.last_error
    assert tqdm_bar(f"{big}%|#| {big}/{big} [") is None


def fresh(tmp_path: Path) -> tuple[Path, LogTail]:
    log = tmp_path / "trainer.log"
    log.write_bytes(b"")
    return log, LogTail(log, None)


def append(log: Path, data: bytes) -> None:
    with open(log, "ab") as f:
        f.write(data)


class Counting(Recognition):
    """The built-in recognition, counting the lines it is handed (what the reader re-reads)."""

    def __init__(self) -> None:
        super().__init__(recognition(None).candidates)
        self.fed: list[int] = []
        self.peeked: list[int] = []

    def feed(self, line: str) -> list[LogStep]:
        self.fed.append(len(line))
        return super().feed(line)

    def peek(self, line: str) -> list[LogStep]:
        self.peeked.append(len(line))
        return super().peek(line)


def test_an_unfinished_line_is_read_once_not_each_tick(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    tail.recognition = counting = Counting()
    append(log, b" 45%|####5     | 45/100 [00:01<00:02, 12.3it/s]")  # a bar's last redraw
    for _ in range(50):  # fifty ticks with nothing new
        tail.read()
    assert len(counting.peeked) == 1
    # A line with no end that passes the bound: its first 4 KiB are read once, the rest skipped.
    append(log, b"\n" + b"1" * MiB)
    for _ in range(50):
        tail.read()
    append(log, b"1" * MiB + b"\nstep 5 loss 2.0\n")
    steps = tail.read()
    assert [s.step for s in steps] == [5]
    assert max(counting.fed) == MAX_LINE_BYTES == 4096
    assert counting.fed.count(MAX_LINE_BYTES) == 1
    assert tail.truncated == 1 and tail.lines[-2] == "1" * MAX_LINE_BYTES


def test_a_read_stops_at_its_budget_and_the_next_goes_on(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"".join(b"step %d loss 2.0\n" % i for i in range(1, 2001)))
    first = tail.read(budget_s=0.0)  # a spent budget: one line, the rest left for later ticks
    assert [s.step for s in first] == [1] and tail.deferred == 1
    steps = list(first)
    for _ in range(5000):
        got = tail.read(budget_s=0.0)
        steps += got
        if not got:
            break
    assert [s.step for s in steps] == list(range(1, 2001))


def test_an_ended_attempt_is_read_to_its_end_past_the_budget(tmp_path: Path) -> None:
    """The final read keeps every line (a traceback is the cause) even once it stops recognising."""
    log, tail = fresh(tmp_path)
    body = b"".join(b"step %d loss 2.0\n" % i for i in range(1, 30001))
    append(log, body + b"Traceback (most recent call last):\n  File \"t.py\"\nKeyError: 'x'\n")
    tail.read(final=True)
    assert tail.lines[-1] == "KeyError: 'x'"
    crash = crash_from_log("\n".join(tail.lines))
    assert crash is not None and crash.chain[0].type == "KeyError"


def test_an_instrumented_attempt_keeps_its_lines_unrecognised(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    tail.recognition = counting = Counting()
    append(log, b"step 1 loss 2.0\n" + b"_" * MiB + b"\n")
    assert tail.read(recognise=False) == []
    assert counting.fed == [] and tail.lines[0] == "step 1 loss 2.0"

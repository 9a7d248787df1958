"""The keeper's log reader (keeper/logtail): lines end at \\n or \\r, an endless line does not grow
memory, an unfinished line is whole once the attempt ends, and what it reads becomes records."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

from trainroom.core.keeper.logtail import KEEP_LINES, MAX_LINE_BYTES, LogTail
from trainroom.core.wire import protocol as p


def fresh(tmp_path: Path, pattern: str | None = None) -> tuple[Path, LogTail]:
    log = tmp_path / "trainer.log"
    return log, LogTail(log, pattern)


def append(log: Path, data: bytes) -> None:
    with open(log, "ab") as f:
        f.write(data)


def test_carriage_returns_end_lines_as_newlines_do(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"iter 1: loss 2.0\riter 2: loss 1.9\r\niter 3: loss 1.8\n")
    assert [s.step for s in tail.read()] == [1, 2, 3]
    assert tail.lines == ["iter 1: loss 2.0", "iter 2: loss 1.9", "iter 3: loss 1.8"]


def test_a_line_split_across_reads_is_read_once_whole(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"iter 12: lo")
    assert tail.read() == []
    append(log, b"ss 2.5\n")
    assert [(s.step, s.loss) for s in tail.read()] == [(12, 2.5)]


def test_an_unfinished_last_line_is_read_when_the_attempt_ends(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"iter 7: loss 2.5")  # killed before its newline
    assert tail.read() == []
    assert [s.step for s in tail.read(final=True)] == [7]
    append(log, b"iter 1: loss 3.0\n")  # the next attempt starts a fresh line
    assert [s.step for s in tail.read()] == [1]


def test_a_mebibyte_line_without_a_newline_does_not_grow_memory(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    tracemalloc.start()
    try:
        for _ in range(8):  # 8 MiB of one line, read as a live keeper would
            append(log, b"x" * (1 << 20))
            tail.read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tail._rest) <= MAX_LINE_BYTES  # the bound is the point
    assert peak < 4 << 20, peak  # one read chunk and one cut line, not the whole line
    append(log, b"still the long line\niter 5: loss 1.0\n")
    assert [s.step for s in tail.read()] == [5]  # the rest of the cut line was skipped
    assert tail.lines[0] == "x" * MAX_LINE_BYTES and "still the long line" not in tail.lines


def test_the_last_lines_are_kept_for_the_crash_reader(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"".join(b"line %d\r" % i for i in range(3 * KEEP_LINES)))
    tail.read()
    while tail.behind:  # (a loaded machine may spend a read's time budget first)
        tail.read()
    assert len(tail.lines) == KEEP_LINES and tail.lines[-1] == f"line {3 * KEEP_LINES - 1}"


def test_records_name_the_recogniser_once_then_the_steps(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"iter 1: loss 2.0\niter 2: loss 1.5\n")
    recs = tail.records(1, 100.0, tail.read())
    assert isinstance(recs[0], p.LogRecognised) and recs[0].name == "nanogpt"
    steps = [r.msg for r in recs[1:] if isinstance(r, p.Received)]
    assert [(s.step, s.loss, s.source) for s in steps if isinstance(s, p.Step)] == [
        (1, 2.0, "log"),
        (2, 1.5, "log"),
    ]
    append(log, b"iter 3: loss 1.4\n")
    assert not any(isinstance(r, p.LogRecognised) for r in tail.records(1, 101.0, tail.read()))


def test_a_copytruncate_is_followed_from_the_start_of_the_file(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"".join(b"iter %d: loss 2.0\n" % i for i in range(1, 200)))
    assert tail.read()[-1].step == 199
    # logrotate's copytruncate: the same file, cut to nothing, the trainer appending on.
    os.truncate(log, 0)
    append(log, b"iter 200: loss 1.9\n")
    assert [s.step for s in tail.read()] == [200]
    assert any("truncated" in n for n in tail.notices)
    # Cut and written past the old offset between two reads: the bytes under the offset changed.
    tail.notices.clear()
    size = log.stat().st_size
    os.truncate(log, 0)
    append(log, b"".join(b"iter %d: loss 1.8\n" % i for i in range(201, 201 + size // 10)))
    steps = [s.step for s in tail.read()]
    assert steps[0] == 201 and tail.notices


def test_a_rename_rotation_reads_the_old_file_out_then_the_new_one(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"iter 1: loss 2.0\n")
    assert [s.step for s in tail.read()] == [1]
    old = log.rename(tmp_path / "trainer.log.1")
    append(old, b"iter 2: loss 2.0\n")  # the trainer's stdout still writes the renamed file
    assert [s.step for s in tail.read()] == [2]
    append(log, b"iter 3: loss 1.9\n")  # something writes the new trainer.log
    assert [s.step for s in tail.read()] == [3]
    assert any("rotated" in n for n in tail.notices)


def test_a_burst_of_megabytes_is_skipped_to_its_newest_lines(tmp_path: Path) -> None:
    log, tail = fresh(tmp_path)
    append(log, b"x" * (200 << 20 >> 4))  # 12.5 MiB without a line end
    append(log, b"\niter 9: loss 2.0\nTraceback (most recent call last):\nValueError: boom\n")
    assert [s.step for s in tail.read(final=True)] == [9]
    assert tail.lines[-2:] == ["Traceback (most recent call last):", "ValueError: boom"]
    assert any("skipped" in n for n in tail.notices)

"""What is planted at trainer.log is not trainroom's: a FIFO there (no reader) would block the
output pump on its open, fill the trainer's pipe and hang the trainer; a symlink there would have
the pump append the trainer's output to whatever it points at. The pump opens O_NONBLOCK|O_NOFOLLOW,
refuses both (a keeper note says which, and that the output is drained and dropped), keeps draining
so the trainer never blocks, and writes again once trainer.log is a regular file."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

# 4 KB a line, as fast as it goes: a blocked pump fills the 1 MiB pipe in a few hundred lines.
CHATTY = (
    "import sys, time, pathlib\n"
    "progress, stop = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
    "i = 0\n"
    "while not stop.exists():\n"
    "    i += 1\n"
    "    print(f'line {i} ' + 'x' * 4000, flush=True)\n"
    "    if i % 50 == 0:\n"
    "        progress.write_text(str(i))\n"
    "        time.sleep(0.01)\n"
)


def _notes(run_dir: str) -> list[str]:
    return [r.message for r in read_journal(Path(run_dir) / runs.JOURNAL_NAME) if isinstance(r, p.KeeperNote)]


def test_a_fifo_or_a_symlink_at_trainer_log_is_refused_and_the_trainer_never_blocks(
    trhome: Path, tmp_path: Path
) -> None:
    progress, stop = tmp_path / "progress", tmp_path / "stop"
    info = launch(
        [sys.executable, "-c", CHATTY, str(progress), str(stop)], {"linger_s": 30}, cwd=str(tmp_path)
    )
    log = Path(info.run_dir) / runs.LOG_NAME

    def lines_done() -> int:
        try:
            return int(progress.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def beyond(n: int) -> int | None:
        got = lines_done()
        return got if got >= n else None

    try:
        wait_for(lambda: beyond(200), timeout=120, what="the trainer printing")
        log.unlink()
        os.mkfifo(log)
        wait_for(
            lambda: any(
                "trainer.log is a FIFO" in m and "drained and dropped" in m for m in _notes(info.run_dir)
            ),
            timeout=120,
            what="the keeper's note that the FIFO is refused",
        )
        # 2,000 more lines of 4 KB (8 MB, eight times the pipe) printed with the FIFO in place.
        at = lines_done()
        wait_for(lambda: beyond(at + 2000), timeout=180, what="the trainer going on past a full pipe's worth")

        outside = tmp_path / "not-trainrooms.txt"
        outside.write_bytes(b"")
        log.unlink()
        log.symlink_to(outside)
        wait_for(
            lambda: any("trainer.log is a symbolic link" in m for m in _notes(info.run_dir)),
            timeout=120,
            what="the keeper's note that the symlink is refused",
        )
        at = lines_done()
        wait_for(lambda: beyond(at + 500), timeout=180, what="the trainer going on beside the symlink")
        assert outside.read_bytes() == b""  # nothing followed the link

        log.unlink()
        wait_for(
            lambda: any("trainer output reaches trainer.log again" in m for m in _notes(info.run_dir)),
            timeout=120,
            what="trainer.log a regular file again",
        )
        wait_for(
            lambda: log.is_file() and b"line " in log.read_bytes()[-8192:], timeout=120, what="lines again"
        )
    finally:
        stop.touch()

"""Reading a crash from a trainer's log (health/crash): a cause printed without a traceback still
joins the chain, and lines another writer logged after the exception are not its message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainroom.core.health.crash import crash_from_log, masked_error


def _output_of(tmp_path: Path, body: str) -> str:
    script = tmp_path / "t.py"
    script.write_text(body)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    return done.stdout + done.stderr


def test_a_cause_that_was_never_raised_still_joins_the_chain(tmp_path: Path) -> None:
    text = _output_of(
        tmp_path,
        'print("Epoch: 3", flush=True)\nraise SystemError("readinto") from OSError(12, "Cannot allocate memory")\n',
    )
    crash = crash_from_log(text)
    assert crash is not None
    assert [(x.type, x.errno_name) for x in crash.chain] == [("SystemError", None), ("OSError", "ENOMEM")]
    f = masked_error(crash.chain)
    assert f is not None and "hides `OSError: [Errno 12] Cannot allocate memory (ENOMEM)`" in f.message


def test_a_launchers_lines_after_a_workers_exception_are_not_its_message() -> None:
    text = "\n".join(
        [
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "x.py", line 3, in <module>',
            "[rank0]: ValueError: boom",
            "[rank0]: the message's second line",
            "E1204 13:00:00.123000 123 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)",
            "torchrun's own line, without a rank prefix",
            "[2026-12-04 13:00:00,123] torch.distributed.elastic: [ERROR] worker group failed",
        ]
    )
    crash = crash_from_log(text)
    assert crash is not None
    assert [(x.type, x.message) for x in crash.chain] == [("ValueError", "boom\nthe message's second line")]
    plain = crash_from_log(
        "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'a'\nINFO:root:shutting down\n"
    )
    assert plain is not None and plain.chain[0].message == "'a'"


def test_a_traceback_printed_after_a_bars_redraw_is_read(tmp_path: Path) -> None:
    """tqdm's last redraw has no line end: the traceback's header follows it on the same line."""
    text = _output_of(
        tmp_path,
        "import sys\n"
        "sys.stderr.write('\\r 14%|#4        | 29/200 [00:05<00:35,  4.85it/s]')\n"
        "raise ValueError('bad shard')\n",
    )
    assert "it/s]Traceback (most recent call last):" in text
    crash = crash_from_log(text)
    assert crash is not None and [(x.type, x.message) for x in crash.chain] == [("ValueError", "bad shard")]


def test_a_dataloader_workers_exception_is_the_innermost_link(tmp_path: Path) -> None:
    """torch re-raises a worker's exception with the worker's traceback inside its message: the
    wrapper keeps its first line, the worker's own exception follows it (what DEAD names)."""
    text = _output_of(
        tmp_path,
        "import torch\n"
        "class D(torch.utils.data.Dataset):\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i): raise KeyError('boom')\n"
        "next(iter(torch.utils.data.DataLoader(D(), num_workers=1)))\n",
    )
    crash = crash_from_log(text)
    assert crash is not None
    assert [(x.type, x.message) for x in crash.chain] == [
        ("KeyError", "Caught KeyError in DataLoader worker process 0."),
        ("KeyError", "'boom' (in DataLoader worker process 0)"),
    ]

"""The keeper gone while its trainer runs on (killed -9): the control room's header says the state
`trainroom status` says (ORPHANED, from the same `run.gone`), its age since the journal's last
write, and UNKNOWN once the orphan is gone too. The orphan is a `sleep` of this test's own, marked
by a per-test marker in its environment, whose pid and start stand in the journal's attempt."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import msgspec
import psutil

from tests.support.tui_fakes import healthy_records, in_loop, make_app, screen_text, settle, until
from trainroom.core.probes.procs import start_ticks
from trainroom.core.run.store import JOURNAL_NAME
from trainroom.core.wire import protocol as p


def orphan_records(pid: int) -> list[object]:
    recs = healthy_records(steps=5)
    first = recs[0]
    assert isinstance(first, p.AttemptStarted)
    recs[0] = msgspec.structs.replace(
        first, pid=pid, pgid=pid, start_time=psutil.Process(pid).create_time(), start_ticks=start_ticks(pid)
    )
    return recs


@in_loop
async def test_an_orphaned_trainer_is_said_orphaned_with_its_true_age_and_then_unknown(
    tmp_path: Path,
) -> None:
    marker = f"trainroom-test-orphan-{uuid.uuid4().hex}"
    orphan = subprocess.Popen(["sleep", "300"], env={**os.environ, "TRAINROOM_TEST_MARKER": marker})
    try:
        now = time.time()
        journal = tmp_path / JOURNAL_NAME
        journal.write_bytes(b"")
        os.utime(journal, (now - 125, now - 125))  # the keeper's last write, 2m05s ago
        app, _, runs = make_app(
            str(tmp_path), orphan_records(orphan.pid), alive=False, now=now, reconnect_interval_s=0.05
        )
        async with app.run_test(size=(160, 48)) as pilot:
            await settle(app, pilot)
            await until(pilot, lambda: app.gone is not None, "the keeper-gone words")
            app.redraw()
            await pilot.pause()
            header = screen_text(app).splitlines()[0]
            view = app.query_one("#header").view
            assert view.state == "orphaned" and view.level == "crit"
            assert " ORPHANED " in header and "RUNNING" not in header and "KEEPER GONE" in header
            assert view.state_age_s == 125.0
            # The words `status` says, word for word (its journal's last write, the two ways on).
            assert view.reason == (
                f"keeper gone (its journal's last write 2m05s ago); trainer pid {orphan.pid} still running "
                f"(orphaned): `trainroom kill {app.run_id}` ends it (then `trainroom resume {app.run_id}`), "
                f"or `trainroom attach {orphan.pid}` takes it back under a new keeper"
            )
            orphan.kill()
            orphan.wait()
            await until(
                pilot, lambda: app.gone is not None and app.gone.state == "unknown", "the orphan gone"
            )
            app.redraw()
            await pilot.pause()
            view = app.query_one("#header").view
            assert view.state == "unknown" and "no longer runs" in view.reason
            assert runs.connects == []
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()

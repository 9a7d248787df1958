"""Tell someone, end to end: a real keeper and the CPU demo trainer, real HTTP receivers
on 127.0.0.1 (one answering 200, one 500, one that hangs until the test lets it go), a real
command hook, a fake `notify-send` on PATH (a script recording its argv: a real command), the
`trainroom export` endpoint scraped over HTTP and checked by promtool and prometheus_client's
parsers, and `trainroom events` from a live keeper and from the journal.

Waits are on conditions with generous bounds (a loaded 2-core machine); no assertion is timed.
Latencies are printed (pytest -s shows them), not asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from tests.support.helpers import run_cli, start_demo, status
from tests.support.receiver import Receiver, receiver
from tests.support.waiting import wait_for
from trainroom.core.configuration.settings import NotifyOptions
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.units import redact_url
from trainroom.core.wire import protocol as p

START_S = 180.0  # torch's import on a loaded machine, then the demo's first steps
SECRET = "s3cr3t-T0KEN-9731"


def _journal(info: runs.RunInfo) -> list[Any]:
    return list(journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _results(info: runs.RunInfo) -> list[p.NotifyResult]:
    return [r for r in _journal(info) if isinstance(r, p.NotifyResult)]


def _bodies(rx: Receiver, path: str) -> list[dict[str, Any]]:
    return [r.json() for r in rx.got(path)]


def _kinds(rx: Receiver, path: str) -> list[tuple[str, str]]:
    return [(b["kind"], b["ident"]) for b in _bodies(rx, path)]


def _titles(rx: Receiver, path: str) -> list[str]:
    """Each message's title, as the channel's receiver sees it (JSON, Slack's text, ntfy's header)."""
    out = []
    for r in rx.got(path):
        if "Title" in r.headers:
            out.append(r.headers["Title"])
        elif "text" in r.json():
            out.append(r.json()["text"].split("*")[1])
        else:
            out.append(r.json()["title"])
    return out


def _recorder(path: Path, out: Path) -> Path:
    """A real command: appends its argv, TRAINROOM_ALERT_* variables and stdin to `out`."""
    path.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        env = {{k: v for k, v in os.environ.items() if k.startswith("TRAINROOM_ALERT_")}}
        with open({str(out)!r}, "a") as f:
            f.write(json.dumps({{"argv": sys.argv, "env": env, "stdin": sys.stdin.read()}}) + "\\n")
        """)
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _calls(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _events_json(run: str) -> list[str]:
    done = run_cli("events", run, "--json")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def ok_rx() -> Iterator[Receiver]:
    with receiver("ok") as r:
        yield r


@pytest.fixture
def failing_rx() -> Iterator[Receiver]:
    with receiver("fail") as r:
        yield r


def test_silent_death_tells_every_channel_once_retries_a_failing_one_and_resolves_after_the_resume(
    trhome: Path, ok_rx: Receiver, failing_rx: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook_out, desktop_out = trhome / "hook.jsonl", trhome / "notify-send.jsonl"
    hook = _recorder(trhome / "hook.py", hook_out)
    bindir = trhome / "bin"
    bindir.mkdir()
    _recorder(bindir / "notify-send", desktop_out)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent-bus")  # the keeper inherits both
    # critical: the demo's DISK_FULL_SOON warning (a tiny disk rate) would ring with each attempt.
    (trhome / "trainroom.toml").write_text(
        textwrap.dedent(f"""\
        [notify]
        min_severity = "critical"
        retries = 2
        backoff_s = 0.05
        webhook = ["{ok_rx.url("/hook/" + SECRET)}", "{failing_rx.url("/fail/" + SECRET)}"]
        slack = "{ok_rx.url("/slack/" + SECRET)}"
        ntfy = "{ok_rx.url("/ntfy/" + SECRET)}"
        command = "{hook} --token {SECRET}"
        desktop = true
        """)
    )
    info = start_demo(fault="silent-death", fault_step=25, steps=40, ckpt_every=10, step_delay=0.02)
    follow_out = trhome / "follow.jsonl"
    with open(follow_out, "w") as f:
        follow = subprocess.Popen(
            [sys.executable, "-m", "trainroom.cli", "events", info.run_id, "--follow", "--json"],
            stdout=f,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_for(lambda: status(info)["state"] == "dead", timeout=START_S, what="DEAD")
        paths = [f"/hook/{SECRET}", f"/slack/{SECRET}", f"/ntfy/{SECRET}"]
        wait_for(lambda: all(ok_rx.got(x) for x in paths), timeout=60, what="the DEAD alert on each channel")
        ended = next(r for r in _journal(info) if isinstance(r, p.AttemptEnded))
        print(f"death -> alert received: {max(ok_rx.got(x)[0].t for x in paths) - ended.t:.3f} s")

        # The webhook's JSON, Slack's text and ntfy's headers, each for the one death.
        (dead,) = _bodies(ok_rx, f"/hook/{SECRET}")
        assert (dead["kind"], dead["ident"], dead["code"], dead["severity"]) == (
            "alert",
            "DEAD",
            "DEAD",
            "critical",
        )
        assert "killed by SIGKILL at step 25" in dead["message"] and dead["action"] == "resume"
        assert dead["run"] == info.run_id and dead["attempt"] == 1
        assert "the trainer died" in json.loads(ok_rx.got(f"/slack/{SECRET}")[0].body)["text"]
        (ntfy,) = ok_rx.got(f"/ntfy/{SECRET}")
        assert ntfy.headers["Priority"] == "5" and "dead" in ntfy.headers["Tags"].split(",")
        assert ntfy.headers["Title"] == f"{info.run_id}: the trainer died"
        assert "killed by SIGKILL" in ntfy.body.decode()
        # The command hook and notify-send: real processes, each given the alert.
        wait_for(
            lambda: _calls(hook_out) and _calls(desktop_out), timeout=60, what="the hook and notify-send"
        )
        (call,) = _calls(hook_out)
        assert (
            call["env"]["TRAINROOM_ALERT_CODE"] == "DEAD"
            and call["env"]["TRAINROOM_ALERT_RUN"] == info.run_id
        )
        assert json.loads(call["stdin"])["ident"] == "DEAD"
        (shown,) = _calls(desktop_out)
        assert shown["argv"][1:3] == ["--app-name=trainroom", "--urgency=critical"]

        # The failing receiver: three tries, each journaled, the last one failed.
        fail_name = "webhook " + redact_url(failing_rx.url("/fail/" + SECRET))

        def tries() -> list[tuple[str, int]]:
            return [
                (r.outcome, r.try_n) for r in _results(info) if r.channel == fail_name and r.alert == "DEAD"
            ]

        wait_for(lambda: len(tries()) == 3, timeout=60, what="three tries at the failing receiver")
        assert tries() == [("retrying", 1), ("retrying", 2), ("failed", 3)] and len(failing_rx.got()) == 3
        assert all(
            r.detail == "HTTP 500 Internal Server Error" for r in _results(info) if r.channel == fail_name
        )

        # Resume: one resolved alert per channel; the run then finishes: one EXITED alert.
        wait_for(
            lambda: any(c["state"] == "verified" and c["step"] == 20 for c in status(info)["checkpoints"]),
            timeout=START_S,
            what="the step-20 checkpoint verified",
        )
        done = run_cli("resume", info.run_id, "--yes", "--json", timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(
            lambda: ("resolved", "DEAD") in _kinds(ok_rx, f"/hook/{SECRET}"), timeout=60, what="DEAD resolved"
        )
        wait_for(lambda: status(info)["state"] == "exited", timeout=START_S, what="attempt 2 to finish")
        run = info.run_id
        for x in paths:
            wait_for(
                lambda x=x: len(rx_titles := _titles(ok_rx, x)) >= 3 and rx_titles,
                timeout=60,
                what=f"EXITED at {x}",
            )
            assert _titles(ok_rx, x) == [
                f"{run}: the trainer died",
                f"resolved: DEAD in {run}",
                f"{run}: the run finished",
            ]
        assert _kinds(ok_rx, paths[0]) == [("alert", "DEAD"), ("resolved", "DEAD"), ("alert", "EXITED")]

        # status --json shows the deliveries; no secret anywhere a reader or a log sees.
        st = run_cli("status", info.run_id, "--json")
        assert st.returncode == 0
        notify = json.loads(st.stdout)["notify"]
        assert notify["outcomes"]["delivered"] >= 3 * 5 and notify["outcomes"]["failed"] >= 1
        assert {r["outcome"] for r in notify["recent"]} >= {"delivered"}
        # The live keeper's journal, read by `events --json`, is what `--follow` printed.
        wait_for(
            lambda: follow_out.read_text().splitlines() == _events_json(info.run_id),
            timeout=60,
            what="events --follow to match events from the journal",
        )
    finally:
        runs.stop_run(info.run_dir)
        follow.wait(timeout=60)
    lines = _events_json(info.run_id)  # the keeper is gone: from the journal
    assert lines == follow_out.read_text().splitlines()
    events = [json.loads(x) for x in lines]
    kinds = {
        (e["event"], e.get("state") or e.get("code") or e.get("action") or e.get("outcome")) for e in events
    }
    assert {("state", "dead"), ("finding", "DEAD"), ("action", "resume"), ("alert", "delivered")} <= kinds
    assert ("finding-cleared", "DEAD") in kinds and ("attempt-ended", None) in kinds
    for text in (
        st.stdout,
        "\n".join(lines),
        (Path(info.run_dir) / runs.KEEPER_LOG_NAME).read_text(errors="replace"),
    ):
        assert SECRET not in text
    assert SECRET.encode() not in (Path(info.run_dir) / runs.JOURNAL_NAME).read_bytes()


def _scrape(url: str, openmetrics: bool = False) -> str:
    accept = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=accept), timeout=30) as resp:
        return str(resp.read().decode())


def _samples(text: str, name: str, **labels: str) -> list[float]:
    return [
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def _promtool(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: prometheus; .ci/run installs it)")
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_hanging_receiver_does_not_hold_the_keeper_and_export_serves_the_run(trhome: Path) -> None:
    """The test alert hangs in its channel (the receiver holds the request open); meanwhile the
    trainer is killed, and the keeper calls it dead, answers `status` and a scrape while that
    request is still open. Then the receiver lets go: the test alert and the DEAD alert queued
    behind it are delivered, once each."""
    with receiver("hang") as rx:
        url = rx.url(f"/hook/{SECRET}")
        opts = NotifyOptions(webhook=[url], min_severity="critical")
        # timeout_s: far beyond the test's own waits, so the request is still open throughout.
        (trhome / "trainroom.toml").write_text("[notify]\ntimeout_s = 300\nretries = 0\n")
        info = start_demo(steps=100000, step_delay=0.05, extra={"notify": opts})
        export = subprocess.Popen(
            [sys.executable, "-m", "trainroom.cli", "export", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        try:
            assert export.stdout is not None
            first = export.stdout.readline().split()
            assert first[0] == "serving" and first[1].startswith("http://127.0.0.1:"), first
            metrics_url = first[1]
            wait_for(lambda: (status(info)["step"] or 0) > 5, timeout=START_S, what="steps")
            text = _scrape(metrics_url)
            _promtool(text)
            lab = {"run": info.run_id, "job": "train", "host": os.uname().nodename}
            assert _samples(text, "trainroom_run_state", state="running", **lab) == [1.0]
            assert _samples(text, "trainroom_keeper_up", **lab) == [1.0]
            assert _samples(text, "trainroom_step", **lab)[0] > 5
            assert _samples(text, "trainroom_rank_step", rank="0", **lab)[0] > 5
            assert _samples(text, "trainroom_lr_effective", rank="0", param_group="0", **lab)[0] > 0
            assert _samples(text, "trainroom_vram_driver_used_bytes", **lab) == []  # no GPU: not invented
            om = {f.name for f in parse_openmetrics(_scrape(metrics_url, openmetrics=True))}
            assert {"trainroom_keeper_cpu_seconds", "trainroom_run_state", "trainroom_checkpoints"} <= om

            tester = subprocess.Popen(
                [sys.executable, "-m", "trainroom.cli", "notify", "--test", info.run_id, "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            wait_for(lambda: rx.got(), timeout=60, what="the test alert in flight")
            pid = status(info)["pid"]
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            d = wait_for(lambda: (s := status(info))["state"] == "dead" and s, timeout=60, what="DEAD")
            # Told while the receiver still holds the test alert's request open.
            assert d["keeper"] == "alive" and tester.poll() is None and len(rx.got()) == 1
            assert _samples(_scrape(metrics_url), "trainroom_run_state", state="dead", **lab) == [1.0]
            dead_at = wait_for(
                lambda: next(
                    (r.t for r in _journal(info) if isinstance(r, p.RunStatus) and r.state == "dead"), None
                ),
                timeout=30,
                what="the DEAD record in the journal",
            )
            print(f"kill -> DEAD record with a hanging receiver: {dead_at - killed_at:.3f} s")

            rx.release.set()
            out, err = tester.communicate(timeout=120)
            assert tester.returncode == 0, out + err
            (result,) = json.loads(out)["results"]
            assert result["outcome"] == "delivered" and json.loads(out)["via"] == "keeper"
            wait_for(lambda: len(rx.got()) == 2, timeout=60, what="the DEAD alert after the test alert")
            assert [(b["kind"], b["ident"]) for b in (r.json() for r in rx.got())] == [
                ("test", "TEST"),
                ("alert", "DEAD"),
            ]
            st = run_cli("status", info.run_id, "--json").stdout
            assert SECRET not in st and SECRET not in out + err
            runs.stop_run(info.run_dir)
            wait_for(
                lambda: _samples(_scrape(metrics_url), "trainroom_runs_live") == [0.0],
                timeout=60,
                what="no live run",
            )
        finally:
            export.kill()
            export.wait(timeout=30)

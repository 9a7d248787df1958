"""Alerts (core/notify) with real parts: a real HTTP receiver on 127.0.0.1, real command hooks
(scripts that record what they were given), the keeper's own records fed to Alerts on a real
asyncio loop. Waits are on conditions with generous bounds; nothing asserts how fast."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.support.helpers import run_cli
from tests.support.receiver import receiver
from tests.support.waiting import wait_for
from trainroom.core.configuration import config as cfg
from trainroom.core.configuration import sections
from trainroom.core.configuration.settings import LaunchOptions, NotifyOptions, notify_settings
from trainroom.core.findings import Finding
from trainroom.core.notify import alert as shapes
from trainroom.core.notify.alerts import Alerts
from trainroom.core.notify.channels import CommandChannel, DeliveryError, HttpChannel, channels_from
from trainroom.core.notify.dispatch import ChannelWorker, Delivery, Dispatcher, TokenBucket
from trainroom.core.run.state import RunState
from trainroom.core.units import redact_command, redact_url
from trainroom.core.wire import protocol as p

SECRET = "T0KEN-s3cr3t-4242"


def policy(**kw: Any) -> sections.Notify:
    return msgspec.convert({"backoff_s": 0.01, **kw}, sections.Notify)


class Journal:
    """The keeper's Recorder, as Alerts sees it: the records it is given, in order."""

    def __init__(self) -> None:
        self.records: list[p.Record] = []

    def emit(self, rec: p.Record, *, journal: bool = True) -> None:
        self.records.append(rec)

    def results(self, outcome: str | None = None) -> list[p.NotifyResult]:
        return [r for r in self.records if isinstance(r, p.NotifyResult) and outcome in (None, r.outcome)]


def finding(code: str, severity: str = "critical", key: str = "", message: str = "it broke") -> Finding:
    return Finding(code=code, severity=severity, message=message, key=key, first_seen=1.0, last_seen=1.0)  # type: ignore[arg-type]


async def _settle(pred: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Let the loop run (results come back through it) until pred holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {pred}")


def run_alerts(pol: sections.Notify, script: Callable[[Alerts, Journal, RunState], Any]) -> Journal:
    """Alerts for a run on a real loop, fed the records `script` emits (an async function)."""
    journal = Journal()
    state = RunState(run_id="r1", argv=["python", "train.py"], cwd="/", created=0.0)

    async def main() -> None:
        channels, unavailable = channels_from(pol, cwd=None, env=os.environ)
        alerts = Alerts(pol, channels, unavailable, sink=journal, state=lambda: state)
        try:
            await script(alerts, journal, state)
        finally:
            await alerts.close()

    asyncio.run(main())
    return journal


def feed(alerts: Alerts, state: RunState, *recs: p.Record) -> None:
    """What Keeper.emit does for each record: fold it, then let the alerts observe it."""
    for r in recs:
        state.apply(r)
        alerts.observe(r)


# ------------------------------------------------------------------------------ dedupe and merge


def test_death_is_one_alert_worded_by_its_finding_then_one_resolved() -> None:
    """The `dead` state and DEAD of attempt 1 (raised in one evaluation) are one alert; the
    keeper's refreshes of the open finding send nothing; the resume clears both: one resolved."""
    with receiver() as rx:

        async def script(alerts: Alerts, journal: Journal, st: RunState) -> None:
            dead = finding("DEAD", key="attempt-1", message="attempt 1 killed by SIGKILL at step 25")
            feed(
                alerts,
                st,
                p.RunStatus(t=2.0, state="dead", reason="killed by SIGKILL"),
                p.FindingRaised(finding=dead),
            )
            await _settle(lambda: rx.got())
            for n in range(3):  # the keeper re-sends an open finding as its figures move
                feed(alerts, st, p.FindingRaised(finding=msgspec.structs.replace(dead, last_seen=3.0 + n)))
            feed(alerts, st, p.FindingCleared(ident="DEAD:attempt-1", t=9.0))
            await asyncio.sleep(0.2)
            assert len(rx.got()) == 1, "the state leaving `dead` is what resolves it, not the finding alone"
            feed(alerts, st, p.RunStatus(t=10.0, state="starting", reason="attempt 2"))
            await _settle(lambda: len(rx.got()) >= 2)

        journal = run_alerts(policy(webhook=rx.url()), script)
        bodies = [r.json() for r in rx.got()]
    assert [(b["kind"], b["ident"]) for b in bodies] == [("alert", "DEAD"), ("resolved", "DEAD")]
    first = bodies[0]
    assert first["message"] == "attempt 1 killed by SIGKILL at step 25"
    assert first["title"] == "r1: the trainer died" and first["severity"] == "critical"
    assert first["action"] == "resume" and first["state"] == "dead" and first["trainroom"] == 1
    assert bodies[1]["state"] == "starting"
    assert [r.kind for r in journal.results("delivered")] == ["alert", "resolved"]


def test_severity_threshold_escalation_and_a_flap_within_one_evaluation() -> None:
    with receiver() as rx:

        async def script(alerts: Alerts, journal: Journal, st: RunState) -> None:
            spike = finding("LOSS_SPIKE", severity="info", key="rank0")
            feed(alerts, st, p.FindingRaised(finding=spike))  # below warning: nothing
            # Raised and cleared before the loop turns: nobody needs to hear of it.
            feed(
                alerts,
                st,
                p.FindingRaised(finding=finding("NONFINITE")),
                p.FindingCleared(ident="NONFINITE", t=2.0),
            )
            await asyncio.sleep(0.2)
            assert rx.got() == []
            feed(alerts, st, p.FindingRaised(finding=msgspec.structs.replace(spike, severity="warning")))
            await _settle(lambda: rx.got())
            feed(alerts, st, p.FindingRaised(finding=msgspec.structs.replace(spike, severity="critical")))
            feed(alerts, st, p.FindingCleared(ident="LOSS_SPIKE:rank0", t=3.0))
            await _settle(lambda: len(rx.got()) >= 2)

        run_alerts(policy(webhook=rx.url()), script)
        got = [(b["kind"], b["ident"], b["severity"]) for b in (r.json() for r in rx.got())]
    assert got == [("alert", "LOSS_SPIKE:rank0", "warning"), ("resolved", "LOSS_SPIKE:rank0", "warning")]


def test_states_not_watched_are_not_alerted_and_unavailable_channels_are_journaled() -> None:
    async def script(alerts: Alerts, journal: Journal, st: RunState) -> None:
        feed(alerts, st, p.KeeperStarted(t=1.0, pid=1), p.RunStatus(t=2.0, state="exited", reason="exit 0"))
        await _settle(lambda: journal.results("unavailable"))

    env_before = os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
    try:
        journal = run_alerts(policy(states=["dead"], desktop=True), script)
    finally:
        if env_before is not None:
            os.environ["DBUS_SESSION_BUS_ADDRESS"] = env_before
    (r,) = journal.results()
    assert r.channel == "desktop notify-send" and "DBUS_SESSION_BUS_ADDRESS" in r.detail


# ------------------------------------------------------------------------------ delivery


def test_a_failing_receiver_is_retried_with_backoff_and_each_try_reported() -> None:
    got: list[p.NotifyResult] = []
    with receiver("fail") as rx:
        pol = policy(webhook=rx.url(), retries=2, backoff_s=0.05)
        d = Dispatcher(channels_from(pol, cwd=None, env={})[0], pol, got.append)
        d.submit(shapes.test_alert(run="r1", host="h", t=time.time(), state=None))
        wait_for(lambda: any(r.outcome == "failed" for r in got), what="the last try to fail")
        d.close(5.0)
        assert len(rx.got()) == 3
    assert [(r.outcome, r.try_n, r.detail) for r in got] == [
        ("retrying", 1, "HTTP 500 Internal Server Error"),
        ("retrying", 2, "HTTP 500 Internal Server Error"),
        ("failed", 3, "HTTP 500 Internal Server Error"),
    ]
    w = d.workers[0]
    assert [w.backoff_s(n) for n in (1, 2, 3)] == [0.05, 0.1, 0.2]


def test_a_hanging_receiver_holds_its_own_channel_only_and_a_full_queue_drops() -> None:
    """Submitting never waits: with the one try in flight hanging, the queue fills and the rest
    are dropped (reported), while the other channel delivers every alert."""
    got: list[p.NotifyResult] = []
    with receiver("hang") as slow, receiver() as fast:
        pol = policy(webhook=[slow.url(), fast.url()], queue=2, retries=0, timeout_s=120)
        d = Dispatcher(channels_from(pol, cwd=None, env={})[0], pol, got.append)
        alert = shapes.test_alert(run="r1", host="h", t=time.time(), state=None)
        d.submit(alert)
        wait_for(lambda: slow.got(), what="the first try in flight")
        for n in range(2, 6):
            d.submit(alert)
            wait_for(lambda n=n: len(fast.got()) == n, what=f"the other channel delivering alert {n}")
        dropped = [r for r in got if r.outcome == "dropped"]
        assert len(dropped) == 2 and all(r.channel == d.workers[0].channel.name for r in dropped)
        assert len(slow.got()) == 1  # still the one, hanging
        slow.release.set()
        d.close(30.0)
    delivered = [r for r in got if r.outcome == "delivered"]
    assert len(delivered) == 5 + 3  # the hung one and the two queued behind it got out at last


def test_the_rate_limit_holds_alerts_and_sends_them_as_one_digest() -> None:
    got: list[p.NotifyResult] = []
    with receiver() as rx:
        pol = policy(webhook=rx.url(), rate_per_min=1)
        d = Dispatcher(channels_from(pol, cwd=None, env={})[0], pol, got.append)
        for code in ("A", "B", "C"):
            d.submit(shapes.from_finding(finding(code), run="r1", host="h", t=1.0, state="running", step=5))
        wait_for(lambda: len([r for r in got if r.outcome == "held"]) == 2, what="two held")
        d.close(10.0)  # what is held goes out as the keeper closes
        bodies = [r.json() for r in rx.got()]
    assert [b["kind"] for b in bodies] == ["alert", "digest"]
    assert [a["code"] for a in bodies[1]["held"]] == ["B", "C"]
    assert bodies[1]["message"].splitlines() == ["B: it broke", "C: it broke"]


def test_token_bucket_allows_a_burst_then_one_per_interval() -> None:
    now = [0.0]
    b = TokenBucket(6, clock=lambda: now[0])
    assert [b.take() for _ in range(7)] == [True] * 6 + [False]
    assert b.wait_s() == pytest.approx(10.0)
    now[0] = 10.0
    assert b.take() and not b.take()


# ------------------------------------------------------------------------------ shapes


def test_ntfy_and_slack_shapes_arrive_as_their_receivers_expect() -> None:
    with receiver() as rx:
        pol = policy(ntfy=rx.url("/trainroom-topic"), slack=rx.url("/services/X"))
        a = shapes.from_state(
            "dead", "killed by SIGKILL → gone", run="r1", host="h", t=1.0, attempt=1, step=9
        )
        for c in channels_from(pol, cwd=None, env={})[0]:
            assert c.send(a, 10.0) == "HTTP 200"
        (ntfy,) = rx.got("/trainroom-topic")
        (slack,) = rx.got("/services/X")
    assert ntfy.body.decode() == "killed by SIGKILL → gone"
    assert ntfy.headers["Title"] == "r1: the trainer died"
    assert ntfy.headers["Priority"] == "5" and ntfy.headers["Tags"] == "rotating_light,trainroom,dead"
    text = slack.json()["text"]
    assert text.startswith(":rotating_light: *r1: the trainer died*") and "`trainroom resume r1`" in text


def _recorder(tmp_path: Path, name: str = "hook.py") -> Path:
    """A real command that writes its argv, TRAINROOM_ALERT_* environment and stdin to a file."""
    script = tmp_path / name
    script.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        out = os.environ.get("HOOK_OUT") or sys.argv[1]
        env = {{k: v for k, v in os.environ.items() if k.startswith("TRAINROOM_ALERT_")}}
        with open(out, "a") as f:
            f.write(json.dumps({{"argv": sys.argv, "env": env, "stdin": sys.stdin.read()}}) + "\\n")
        sys.exit(int(os.environ.get("HOOK_EXIT", "0")))
        """)
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_command_hook_gets_the_alert_in_its_environment_and_as_json_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "calls.jsonl"
    hook = _recorder(tmp_path)
    c = CommandChannel(f"{hook} {out} --token {SECRET}", cwd=str(tmp_path), env={"PATH": os.environ["PATH"]})
    a = shapes.from_finding(
        finding("DEAD", key="attempt-1"), run="r1", host="h", t=1.0, state="dead", step=25
    )
    assert c.send(a, 30.0) == "exit 0"
    (call,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert call["env"]["TRAINROOM_ALERT_CODE"] == "DEAD" and call["env"]["TRAINROOM_ALERT_IDENT"] == "DEAD"
    assert call["env"]["TRAINROOM_ALERT_STEP"] == "25" and call["env"]["TRAINROOM_ALERT_KIND"] == "alert"
    assert json.loads(call["stdin"])["message"] == "it broke"
    assert SECRET not in c.name and c.name.startswith("command hook.py …#")
    failing = CommandChannel(f"{hook} {out}", cwd=None, env={"HOOK_EXIT": "3", "PATH": os.environ["PATH"]})
    with pytest.raises(DeliveryError, match="exit 3"):
        failing.send(a, 30.0)


def test_desktop_channel_runs_notify_send_where_a_session_bus_exists(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    out = tmp_path / "notify-send.jsonl"
    _recorder(bindir, "notify-send")
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent",
        "HOOK_OUT": str(out),
    }
    (c,), unavailable = channels_from(policy(desktop=True), cwd=None, env=env)
    assert unavailable == []
    c.send(shapes.from_state("hung", "parked", run="r1", host="h", t=1.0, attempt=1, step=3), 30.0)
    (call,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert call["argv"][1:] == [
        "--app-name=trainroom",
        "--urgency=critical",
        "r1: the trainer hung",
        "parked",
    ]
    _, unavailable = channels_from(policy(desktop=True), cwd=None, env={"PATH": env["PATH"]})
    assert [n for n, _ in unavailable] == ["desktop notify-send"]


# ------------------------------------------------------------------------------ secrets


def test_secrets_never_leave_a_channel_name_an_error_or_the_options_readers_see() -> None:
    url = f"http://user:{SECRET}@127.0.0.1:9/hooks/{SECRET}?token={SECRET}"
    shown = redact_url(url)
    assert SECRET not in shown and shown.startswith("http://127.0.0.1:9/…#")
    assert redact_url(url) != redact_url(url.replace("hooks", "other"))  # two targets stay apart
    assert SECRET not in redact_command(f"curl -H 'Authorization: Bearer {SECRET}' https://x")
    c = HttpChannel("webhook", url, lambda a: (b"{}", {}))
    with pytest.raises(DeliveryError) as exc:  # port 9 (discard) is closed here: refused
        c.send(shapes.test_alert(run="r", host="h", t=0.0, state=None), 5.0)
    assert SECRET not in str(exc.value) and SECRET not in c.name
    opts = LaunchOptions(notify=NotifyOptions(webhook=[url], command=[f"hook --token {SECRET}"]))
    assert SECRET not in msgspec.json.encode(opts.shown()).decode()


def test_credentials_in_the_url_become_a_basic_authorization_header() -> None:
    with receiver() as rx:
        c = HttpChannel(
            "ntfy", rx.url("/topic").replace("http://", "http://alice:pw%21@"), shapes.ntfy_request
        )
        c.send(shapes.test_alert(run="r", host="h", t=0.0, state=None), 10.0)
        (got,) = rx.got("/topic")
    assert got.headers["Authorization"] == "Basic YWxpY2U6cHch"  # alice:pw!


# ------------------------------------------------------------------------------ config and CLI


def test_notify_section_takes_one_target_or_a_list_and_refuses_a_bad_url_without_echoing_it() -> None:
    c = cfg.decode_config(
        '[notify]\nwebhook = "https://a.example/x"\nntfy = ["https://n.example/t1", "https://n.example/t2"]\n'
    )
    assert (
        sections.as_list(c.notify.webhook) == ["https://a.example/x"]
        and len(sections.as_list(c.notify.ntfy)) == 2
    )
    assert c.notify.min_severity == "warning" and c.notify.states == ["dead", "hung", "stalled", "exited"]
    with pytest.raises(sections.ConfigError) as exc:
        cfg.decode_config(f'[notify]\nwebhook = ["https://ok.example", "ftp://{SECRET}/x"]\n')
    assert "notify.webhook[1]: expected an http:// or https:// URL" in str(exc.value) and SECRET not in str(
        exc.value
    )
    with pytest.raises(sections.ConfigError, match=r"notify\.timeout_s"):
        cfg.decode_config("[notify]\ntimeout_s = inf\n")
    with pytest.raises(sections.ConfigError, match=r"notify\.min_severity"):
        cfg.decode_config('[notify]\nmin_severity = "loud"\n')


def test_launch_flags_add_to_the_file_and_override_its_threshold() -> None:
    file = cfg.decode_config('[notify]\nwebhook = "https://a.example/x"\nmin_severity = "info"\n').notify
    merged = notify_settings(
        NotifyOptions(webhook=["https://a.example/x", "https://b.example/y"], min_severity="critical"), file
    )
    assert (
        merged.webhook == ["https://a.example/x", "https://b.example/y"] and merged.min_severity == "critical"
    )


def test_notify_test_without_a_run_uses_the_config_here_and_prints_each_result(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proj = tmp_path / "proj"
    proj.mkdir()
    with receiver() as ok, receiver("fail") as bad:
        (proj / "trainroom.toml").write_text(
            f'[notify]\nretries = 0\nwebhook = ["{ok.url("/ok/" + SECRET)}", "{bad.url("/bad")}"]\n'
        )
        env = {**os.environ, "TRAINROOM_HOME": str(home)}
        done = _cli_in(proj, env, "notify", "--test", "--json")
        assert len(ok.got()) == 1 and len(bad.got()) == 1
    assert done.returncode == 1, done.stderr
    out = json.loads(done.stdout)
    assert out["via"] == "here" and [r["outcome"] for r in out["results"]] == ["delivered", "failed"]
    assert ok.got()[0].json()["kind"] == "test"
    assert SECRET not in done.stdout + done.stderr
    nothing = _cli_in(tmp_path, {**env, "TRAINROOM_HOME": str(tmp_path / "empty")}, "notify", "--test")
    assert nothing.returncode == 2 and "no alert channels configured" in nothing.stderr
    assert "Traceback" not in nothing.stderr


def _cli_in(cwd: Path, env: dict[str, str], *args: str) -> Any:
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "trainroom.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_launch_refuses_a_bad_notify_flag_in_one_line(tmp_path: Path) -> None:
    done = run_cli(
        "launch",
        "--notify-webhook",
        f"file:///{SECRET}",
        "--",
        "true",
        env={**os.environ, "TRAINROOM_HOME": str(tmp_path)},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "trainroom: error: --notify-webhook: expected an http:// or https:// URL, got scheme 'file'"
    ]


def test_a_test_alert_reaches_the_worker_even_past_the_rate_limit() -> None:
    got: list[p.NotifyResult] = []
    with receiver() as rx:
        pol = policy(webhook=rx.url(), rate_per_min=1)
        w = ChannelWorker(channels_from(pol, cwd=None, env={})[0][0], pol, got.append)
        a = shapes.test_alert(run="r", host="h", t=time.time(), state=None)
        w.offer(Delivery(alert=a, tries=1))
        import concurrent.futures

        futs: list[concurrent.futures.Future[p.NotifyResult]] = [
            concurrent.futures.Future() for _ in range(2)
        ]
        for f in futs:
            w.offer(Delivery(alert=a, tries=1, limited=False, done=f))
        assert [f.result(timeout=30).outcome for f in futs] == ["delivered", "delivered"]
        w.close(5.0)
        assert len(rx.got()) == 3

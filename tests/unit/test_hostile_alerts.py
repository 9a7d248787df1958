"""Alerts against hostile text and receivers: a NUL (or another control character) in an
exception's text never loses an alert on the command channel (the environment and arguments are
cleaned; the JSON on stdin keeps every character); a receiver that drips its answer one byte at a
time is cut off at the delivery's overall deadline, not waited on read after read."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import msgspec
import pytest

from tests.support.receiver import receiver
from trainroom.core.notify import alert as alerts
from trainroom.core.notify.channels import CommandChannel, DeliveryError, HttpChannel, _json_shape


def _alert(message: str) -> alerts.Alert:
    base = alerts.test_alert(run="r1", host="h", t=time.time(), state=None)
    return msgspec.structs.replace(base, kind="finding", code="DEAD", message=message)


def test_a_nul_in_the_message_never_loses_the_alert_on_the_command_channel(tmp_path: Path) -> None:
    out = tmp_path / "hook.json"
    code = (
        "import json, os, sys; "
        f"json.dump({{'env': os.environ['TRAINROOM_ALERT_MESSAGE'], 'stdin': sys.stdin.read()}}, open({str(out)!r}, 'w'))"
    )
    ch = CommandChannel(
        f"{sys.executable} -c {json.dumps(code)}", cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"}
    )
    msg = "ValueError: bad byte \x00 in\x1b[31m the batch\nnext line"
    assert ch.send(_alert(msg), timeout_s=60) == "exit 0"
    got = json.loads(out.read_text())
    assert got["env"] == "ValueError: bad byte \ufffd in\ufffd[31m the batch\nnext line"
    assert json.loads(got["stdin"])["message"] == msg  # the full text, every character
    assert "\x00" not in " ".join(alerts.desktop_argv(_alert(msg)))


def test_a_dripping_receiver_is_cut_off_at_the_overall_deadline() -> None:
    with receiver("drip") as rx:
        ch = HttpChannel("webhook", rx.url(), _json_shape)
        t0 = time.monotonic()
        with pytest.raises(DeliveryError, match=r"no complete answer within 2(\.0)? s: cut off"):
            ch.send(_alert("x"), timeout_s=2.0)
        took = time.monotonic() - t0
        rx.release.set()
    # Bounded by the deadline, not by 600 drips of 0.5 s (a bound, generous for a loaded host).
    assert took < 60, took
    with receiver("ok") as rx:
        assert HttpChannel("webhook", rx.url(), _json_shape).send(_alert("x"), timeout_s=5.0) == "HTTP 200"

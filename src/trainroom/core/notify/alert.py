"""An alert: what the keeper tells someone, and the shapes each channel sends it in.

One Alert is made per finding identity (or watched state) when it opens, one `resolved` when it
closes; a `test` alert comes from `trainroom notify --test`, a `digest` gathers alerts the rate
limit held back. The shapes: trainroom's JSON (webhook, and the command hook's stdin), Slack's
incoming-webhook JSON, ntfy's body and headers, TRAINROOM_ALERT_* variables, notify-send's argv.
"""

from __future__ import annotations

import base64
import re
from typing import Any

import msgspec

from trainroom.core.findings import SEVERITY_RANK, Finding
from trainroom.core.vocab import ALERTED_AS_STATE, ActionName, AlertKind, Severity, StateName

SCHEMA = 1  # the `trainroom` field of the JSON shape: bumped if a field changes meaning

# A watched state's severity, and the finding whose identity it shares: DEAD raised with the
# `dead` state is one alert, not two.
STATE_SEVERITY: dict[StateName, Severity] = {
    "dead": "critical",
    "hung": "critical",
    "stalled": "warning",
    "stopped": "info",
    "exited": "info",
}
STATE_TITLE: dict[StateName, str] = {
    "dead": "the trainer died",
    "hung": "the trainer hung",
    "stalled": "the trainer stalled",
    "stopped": "the trainer was stopped by a kill",
    "exited": "the run finished",
}


class Alert(msgspec.Struct, kw_only=True, omit_defaults=True):
    kind: AlertKind
    ident: str  # a finding's identity (`LOSS_SPIKE:rank1`), or a state's name in capitals
    code: str  # a finding's code, a state's name in capitals, TEST or DIGEST
    severity: Severity
    title: str
    message: str
    run: str
    host: str
    t: float  # when the condition was seen (or cleared); latencies are measured from here
    state: StateName | None = None  # the run's state when the alert was made
    action: ActionName | None = None  # the keeper action a finding suggests (`resume`, `dump`)
    attempt: int | None = None
    step: int | None = None
    evidence: dict[str, Any] = {}
    held: list[Alert] = []  # a digest's alerts, in the order they were held


# The findings a watched state comes with: one alert between them (alert_ident).
STATE_FINDINGS = ALERTED_AS_STATE


def state_ident(state: StateName) -> str:
    return state.upper()


def alert_ident(f: Finding) -> str:
    """A finding's alert identity: its ident, or for DEAD, HUNG and STALLED (whose key names the
    attempt or rank) the state it comes with."""
    return f.code if f.code in STATE_FINDINGS else f.ident


def from_finding(f: Finding, *, run: str, host: str, t: float, state: StateName, step: int | None) -> Alert:
    return Alert(
        kind="alert",
        ident=alert_ident(f),
        code=f.code,
        severity=f.severity,
        title=f"{f.code} ({f.severity}) in {run}",
        message=f.message,
        run=run,
        host=host,
        t=t,
        state=state,
        action=f.action,
        step=step,
        evidence=f.evidence,
    )


def from_state(
    state: StateName, reason: str, *, run: str, host: str, t: float, attempt: int | None, step: int | None
) -> Alert:
    return Alert(
        kind="alert",
        ident=state_ident(state),
        code=state_ident(state),
        severity=STATE_SEVERITY.get(state, "warning"),
        title=f"{run}: {STATE_TITLE.get(state, state)}",
        message=reason or state,
        run=run,
        host=host,
        t=t,
        state=state,
        action="resume" if state == "dead" else ("dump" if state in ("hung", "stalled") else None),
        attempt=attempt,
        step=step,
    )


def resolved(alert: Alert, *, t: float, state: StateName, step: int | None) -> Alert:
    """The follow-up of an alert whose condition cleared (or whose state the run left)."""
    return msgspec.structs.replace(
        alert,
        kind="resolved",
        title=f"resolved: {alert.code} in {alert.run}",
        message=f"{alert.code} cleared; the run is {state} now (was: {alert.message})",
        t=t,
        state=state,
        step=step,
        action=None,
        evidence={},
    )


def test_alert(*, run: str, host: str, t: float, state: StateName | None) -> Alert:
    return Alert(
        kind="test",
        ident="TEST",
        code="TEST",
        severity="info",
        title=f"trainroom test alert for {run}",
        message=f"A test alert from trainroom on {host}: this channel works.",
        run=run,
        host=host,
        t=t,
        state=state,
    )


def digest(alerts: list[Alert], *, t: float) -> Alert:
    """Alerts the rate limit held, as one: the most severe first in the title, each on a line."""
    worst = max(alerts, key=lambda a: SEVERITY_RANK.get(a.severity, 0))
    lines = [f"{'resolved ' if a.kind == 'resolved' else ''}{a.code}: {a.message}" for a in alerts]
    return Alert(
        kind="digest",
        ident="DIGEST",
        code="DIGEST",
        severity=worst.severity,
        title=f"{len(alerts)} alerts for {worst.run} (held by the rate limit)",
        message="\n".join(lines),
        run=worst.run,
        host=worst.host,
        t=t,
        state=alerts[-1].state,
        held=alerts,
    )


# ------------------------------------------------------------------------------------ shapes


def json_body(alert: Alert) -> bytes:
    """trainroom's own JSON: the webhook's body and the command hook's stdin. Non-finite figures
    in the evidence are null (msgspec), so every reader can parse it."""
    out = msgspec.to_builtins(alert)
    assert isinstance(out, dict)
    return msgspec.json.encode({"trainroom": SCHEMA, **out})


_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}


def slack_body(alert: Alert) -> bytes:
    """Slack's incoming-webhook shape (also taken by Mattermost, Rocket.Chat and Discord's
    /slack endpoints): one mrkdwn `text`."""
    mark = ":white_check_mark:" if alert.kind == "resolved" else _EMOJI.get(alert.severity, "")
    tail = f"_run {alert.run} on {alert.host}" + (f", step {alert.step}" if alert.step is not None else "")
    action = f" · suggested: `trainroom {alert.action} {alert.run}`" if alert.action else ""
    text = f"{mark} *{alert.title}*\n{alert.message}\n{tail}_{action}"
    return msgspec.json.encode({"text": text})


_NTFY_PRIORITY = {"critical": "5", "warning": "4", "info": "3"}


def _header(value: str) -> str:
    """A header value http.client can send: ASCII as is, else RFC 2047 (ntfy decodes it)."""
    value = " ".join(value.split())
    if value.isascii():
        return value
    return "=?UTF-8?B?" + base64.b64encode(value.encode()).decode() + "?="


def ntfy_request(alert: Alert) -> tuple[bytes, dict[str, str]]:
    """ntfy's publish-as-POST: the message as the body; title, priority and tags as headers."""
    resolved_ = alert.kind == "resolved"
    tags = [
        "white_check_mark" if resolved_ else ("rotating_light" if alert.severity == "critical" else "warning")
    ]
    tags += ["trainroom", alert.code.lower()]
    headers = {
        "Title": _header(alert.title),
        "Priority": "3" if resolved_ else _NTFY_PRIORITY.get(alert.severity, "3"),
        "Tags": ",".join(tags),
        "Content-Type": "text/plain; charset=utf-8",
    }
    return alert.message.encode(), headers


def environment(alert: Alert) -> dict[str, str]:
    """The command hook's TRAINROOM_ALERT_* variables (the full alert is JSON on its stdin)."""
    fields: dict[str, object] = {
        "KIND": alert.kind,
        "IDENT": alert.ident,
        "CODE": alert.code,
        "SEVERITY": alert.severity,
        "TITLE": alert.title,
        "MESSAGE": alert.message,
        "RUN": alert.run,
        "HOST": alert.host,
        "T": f"{alert.t:.3f}",
        "STATE": alert.state,
        "ACTION": alert.action,
        "ATTEMPT": alert.attempt,
        "STEP": alert.step,
    }
    return {f"TRAINROOM_ALERT_{k}": clean(str(v)) for k, v in fields.items() if v is not None}


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """Text fit for an environment variable or an argument: a NUL (which no exec takes) and the
    other control characters but newline and tab shown as U+FFFD. The JSON on stdin keeps them."""
    return _CONTROL.sub("\ufffd", text)


_URGENCY = {"critical": "critical", "warning": "normal", "info": "low"}


def desktop_argv(alert: Alert) -> list[str]:
    urgency = "normal" if alert.kind == "resolved" else _URGENCY.get(alert.severity, "normal")
    return [
        "notify-send",
        "--app-name=trainroom",
        f"--urgency={urgency}",
        clean(alert.title),
        clean(alert.message),
    ]

"""The sections of trainroom.toml beyond the run's own policy: `[notify]` (who is told),
`[hosts.NAME]` (machines over SSH), `[keys]` (the control room's keymap) and `[journal]` (how a
long run is journaled), with the checks types alone cannot make. `config` composes them into the
file's `Config` and re-exports every name here."""

from __future__ import annotations

import os
import re
import shlex
from typing import Annotated
from urllib.parse import urlsplit

import msgspec

from trainroom.core.units import MIB
from trainroom.core.vocab import ALERT_STATES as ALERT_STATES
from trainroom.core.vocab import AlertState as AlertState
from trainroom.core.vocab import Severity


class ConfigError(Exception):
    """A config file that cannot be used; str() is one line: file, key path, what was expected."""


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A table of trainroom.toml: an unknown key is an error that names it."""


AlertSeverity = Severity
# One target or a list of them: `webhook = "https://..."` and `webhook = ["https://...", ...]`.
Targets = str | list[str]


def as_list(targets: Targets) -> list[str]:
    return [targets] if isinstance(targets, str) else list(targets)


class Notify(Section):
    """Alerts from the keeper (core/notify): who is told, about what, how hard it tries.

    Targets are secrets (a Slack webhook's path, an ntfy topic, a token in a command): the keeper
    reads them from here or the run record and only ever journals, prints or sends a redacted name.
    """

    # Findings at or above this severity are alerted (state changes always are, see `states`).
    min_severity: AlertSeverity = "warning"
    states: list[AlertState] = msgspec.field(default_factory=lambda: list(ALERT_STATES))
    # A command run with the alert in TRAINROOM_ALERT_* variables and as JSON on stdin (no shell).
    command: Targets = []
    # JSON POSTs: trainroom's own shape (`webhook`) or Slack's incoming-webhook shape (`slack`).
    webhook: Targets = []
    slack: Targets = []
    # ntfy-style POSTs: the message as the body, title, priority and tags as headers.
    ntfy: Targets = []
    # notify-send, where a session bus exists (DBUS_SESSION_BUS_ADDRESS).
    desktop: bool = False
    # One delivery: each try may take timeout_s; a failed one is retried `retries` times, after
    # backoff_s, doubling, at most backoff_max_s apart.
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=300)] = 5.0
    retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 3
    backoff_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 1.0
    backoff_max_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 60.0
    # At most this many alerts a minute per channel; the rest wait and go out as one digest.
    rate_per_min: Annotated[int, msgspec.Meta(ge=1, le=600)] = 10
    # Alerts waiting per channel; past it new ones are dropped (and the drop journaled).
    queue: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 64


class Host(Section):
    """`[hosts.NAME]`: a machine a job's keepers run on, reached over SSH (`ssh://NAME/RUN`, or
    `NAME` as a `trainroom job` target)."""

    target: str  # ssh://[user@]host[:port]
    # The trainroom command on that host (default: TRAINROOM_REMOTE_COMMAND, else `trainroom`).
    remote_command: str | None = None


# A key as the control room names it: `k`, `K`, `ctrl+k`, `f5`, `slash`, `/` (one printable
# character is taken as is); several for one command are comma-separated ("z,f11").
_KEY = re.compile(r"^(?:[A-Za-z0-9_+-]+|[^\s,])$")


class Keys(Section):
    """The control room's keys, by command (its `--help` and `?` list them with their defaults);
    an unset one keeps its default. Two commands on one key is refused when the control room
    opens, naming both."""

    kill: str | None = None
    reclaim: str | None = None
    prune: str | None = None
    resume: str | None = None
    dump: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")
    verify: str | None = None
    bench: str | None = None
    help: str | None = None
    quit: str | None = None
    theme: str | None = None
    runs: str | None = None
    processes: str | None = None
    history: str | None = None
    options: str | None = None
    command: str | None = None
    zoom: str | None = None
    next_panel: str | None = None
    previous_panel: str | None = None
    search: str | None = None
    log_scale: str | None = None
    recent_window: str | None = None
    cancel: str | None = None

    def given(self) -> dict[str, str]:
        """The commands this file remaps, by their name in the file."""
        out: dict[str, str] = {}
        for f in msgspec.structs.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.encode_name] = value
        return out


class JournalPolicy(Section):
    """How the keeper journals a run that lasts weeks (README: "Runs that last weeks")."""

    # Step and heartbeat records wait in memory up to this long (or batch_rows steps) and are
    # written as one compressed batch. What a keeper killed with -9 can lose from the journal
    # (the live control room saw them); a longer wait packs slow runs tighter.
    batch_s: Annotated[float, msgspec.Meta(ge=0.05, le=60)] = 5.0
    batch_rows: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 4096
    # A folded snapshot of the run every this many records: what a reader of a finished run
    # replays at most after loading the newest snapshot.
    snapshot_records: Annotated[int, msgspec.Meta(ge=1000, le=10_000_000)] = 10000
    # The active journal segment is sealed at this size; a new one begins with the fold of all
    # before it.
    segment_mib: Annotated[float, msgspec.Meta(ge=0.0625, le=4096)] = 64.0
    # Sealed segments keep every step record for this many hours and within this many MiB (the
    # newest first); past either, only their other records stay (the plot keeps its min/max
    # buckets for the whole run either way).
    full_resolution_h: Annotated[float, msgspec.Meta(ge=0, le=87600)] = 72.0
    full_resolution_mib: Annotated[float, msgspec.Meta(ge=0, le=1_048_576)] = 2048.0

    @property
    def segment_bytes(self) -> int:
        return int(self.segment_mib * MIB)

    @property
    def full_resolution_bytes(self) -> int:
        return int(self.full_resolution_mib * MIB)


def check_url(url: str) -> str | None:
    """Why an alert URL cannot be used (one phrase), or None. Never echoes the URL: it may hold a
    secret."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"expected an http:// or https:// URL, got scheme {parts.scheme or 'none'!r}"
    if not parts.hostname:
        return "expected a URL with a host"
    return None


def check_command(command: str) -> str | None:
    """Why an alert command cannot be used, or None."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        return f"expected a shell-like command, got one that fails: {exc}"
    return None if words else "expected a command, got an empty string"


def check_notify(n: Notify, path: str | os.PathLike[str]) -> None:
    for key in ("webhook", "slack", "ntfy"):
        for i, url in enumerate(as_list(getattr(n, key))):
            why = check_url(url)
            if why:
                raise ConfigError(f"{path}: notify.{key}[{i}]: {why}")
    for i, command in enumerate(as_list(n.command)):
        why = check_command(command)
        if why:
            raise ConfigError(f"{path}: notify.command[{i}]: {why}")


def check_hosts(hosts: dict[str, Host], path: str | os.PathLike[str]) -> None:
    for name, host in hosts.items():
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", name):
            raise ConfigError(f"{path}: hosts.{name}: expected a host name (letters, digits, . _ -)")
        if not host.target.startswith("ssh://") or any(c.isspace() for c in host.target):
            raise ConfigError(
                f"{path}: hosts.{name}.target: expected ssh://[user@]host[:port], got {host.target!r}"
            )
        if host.remote_command is not None:
            why = check_command(host.remote_command)
            if why:
                raise ConfigError(f"{path}: hosts.{name}.remote_command: {why}")


def check_keys(keys: Keys, path: str | os.PathLike[str]) -> None:
    for name, value in keys.given().items():
        parts = [k.strip() for k in value.split(",")]
        bad = next((k for k in parts if not _KEY.match(k)), None)
        if bad is not None:
            raise ConfigError(
                f'{path}: keys.{name}: expected key names such as "ctrl+k" or "z,f11", got {value!r}'
            )

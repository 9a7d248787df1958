"""`ssh://[user@]host[:port][/RUN]`: where a remote run is, and how `trainroom.toml` names hosts.

A host may be an alias from `[hosts.NAME]` in trainroom.toml (`ssh://gpu1/RUN` or plain `gpu1`
where a job target is expected): the alias brings its own user, port and remote command. Anything
else is handed to `ssh` as written, so `~/.ssh/config` aliases work too.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import msgspec

from trainroom.core.configuration import config as cfg
from trainroom.core.configuration import sections
from trainroom.core.run.address import SCHEME

# A host is a DNS name, an IPv4 address, or an IPv6 address in brackets; no shell metacharacters
# (the host is an argument to ssh, never to a shell, but a leading '-' would read as an option).
_HOST = r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_][A-Za-z0-9_.\-]*)"
_TARGET = re.compile(
    r"^ssh://(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.\-]*)@)?"
    + _HOST
    + r"(?::(?P<port>[0-9]{1,5}))?(?:/(?P<run>.*))?$"
)
_RUN = re.compile(r"^[A-Za-z0-9_.\-/]*$")


class TargetError(ValueError):
    """A target that does not parse: one line naming the part and why."""


class SshTarget(msgspec.Struct, frozen=True, kw_only=True):
    host: str
    user: str | None = None
    port: int | None = None
    run: str | None = None  # a run spec on that host (id, prefix, suffix); None: its newest
    # From trainroom.toml's [hosts.NAME]: the remote trainroom command for this host only.
    remote_command: str | None = None
    alias: str | None = None

    @property
    def node(self) -> str:
        """The address without the run: `ssh://user@host:port` (the alias, when the host came
        from trainroom.toml, so parsing it again finds the same host)."""
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port is not None else ""
        return f"{SCHEME}{user}{self.alias or self.host}{port}"

    @property
    def destination(self) -> str:
        """What ssh is given: `user@host` (brackets of an IPv6 literal dropped)."""
        host = self.host[1:-1] if self.host.startswith("[") else self.host
        return f"{self.user}@{host}" if self.user else host

    def with_run(self, run: str | None) -> SshTarget:
        return msgspec.structs.replace(self, run=run)

    def __str__(self) -> str:
        return f"{self.node}/{self.run}" if self.run else self.node


def parse_target(spec: str, hosts: dict[str, sections.Host] | None = None) -> SshTarget:
    """Parse `ssh://[user@]host[:port][/RUN]`; a host named in `hosts` is expanded (the target's
    own user, port and run win over the alias's)."""
    m = _TARGET.match(spec)
    if m is None:
        raise TargetError(f"{spec!r}: expected ssh://[user@]host[:port][/RUN]")
    port = int(m.group("port")) if m.group("port") else None
    if port is not None and not 1 <= port <= 65535:
        raise TargetError(f"{spec!r}: port {port} is not in [1, 65535]")
    run = unquote(m.group("run")) if m.group("run") else None
    if run is not None and (not _RUN.match(run) or run.startswith("-")):
        raise TargetError(f"{spec!r}: run {run!r} is not a run id, prefix or run dir")
    target = SshTarget(host=m.group("host"), user=m.group("user"), port=port, run=run or None)
    alias = (hosts or {}).get(target.host)
    if alias is None:
        return target
    base = parse_target(alias.target)  # validated when the config was loaded
    return SshTarget(
        host=base.host,
        user=target.user or base.user,
        port=target.port if target.port is not None else base.port,
        run=target.run or base.run,
        remote_command=alias.remote_command,
        alias=target.host,
    )


def configured_hosts() -> dict[str, sections.Host]:
    """`[hosts]` of the trainroom.toml in force here (the current dir, then the state dir)."""
    config, _path = cfg.load_config(Path.cwd())
    return config.hosts


def resolve_target(spec: str) -> SshTarget:
    """A target as the user wrote it, with trainroom.toml's host aliases expanded."""
    return parse_target(spec, configured_hosts())

"""Where a run is: a local run directory or keeper socket, or `ssh://[user@]host[:port][/RUN]` on
another host. The read model only tells them apart; a remote one is reached through what the
remote package installs (`store.REMOTE`, `client.DIALER`: see `remote.reach`), so nothing under
run speaks ssh."""

from __future__ import annotations

SCHEME = "ssh://"


def is_remote(spec: str | None) -> bool:
    return bool(spec) and str(spec).startswith(SCHEME)

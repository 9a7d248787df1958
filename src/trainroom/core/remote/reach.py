"""Runs and keepers on other hosts, reached over ssh: what the read model's hooks for remote
addresses (`run.store.REMOTE`, `run.client.DIALER`) are given in a process that may reach other
hosts. `install` is called where such an address comes in (the command line's routing, a job's
node list); until then the read model refuses remote addresses instead of importing ssh. Installing
costs nothing: ssh and the target parser are imported when a remote address first comes in."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from trainroom.core.run import client, store
from trainroom.core.run.client import KeeperGone, KeeperUnreachable
from trainroom.core.run.store import RunError, RunInfo, RunUnreachable
from trainroom.core.vocab import KeeperWord

if TYPE_CHECKING:
    from trainroom.core.run.view import RunView


class SshRuns:
    def run(self, spec: str, job: str | None) -> RunInfo:
        from trainroom.core.remote import ssh
        from trainroom.core.remote.target import TargetError, resolve_target

        try:
            target = resolve_target(spec)
            said = ssh.hello(target, job=job)
        except ssh.Unreachable as exc:
            raise RunUnreachable(str(exc)) from None
        except (TargetError, ssh.RemoteRefused) as exc:
            raise RunError(str(exc)) from None
        if said.run_id is None:
            raise RunError(f"{target.node}: the bridge named no run")
        address = str(target.with_run(said.run_id))
        return RunInfo(
            run_id=said.run_id,
            run_dir=address,
            sock=address,
            created=said.created or 0.0,
            argv=said.argv,
            alive=said.keeper != "gone",
            remote=target.node,
            host=said.host,
        )

    def view(self, address: str) -> RunView:
        import msgspec

        from trainroom.core.remote import ssh
        from trainroom.core.remote.target import TargetError, resolve_target
        from trainroom.core.run.view import RunView

        try:
            return RunView.from_snapshot(ssh.fetch_snapshot(resolve_target(address))[1])
        except ssh.Unreachable as exc:
            raise RunUnreachable(str(exc)) from None
        except (TargetError, ssh.RemoteRefused) as exc:
            raise RunError(str(exc)) from None
        except msgspec.ValidationError as exc:  # a word of a newer trainroom there
            raise RunError(
                f"{address}: its state does not decode here (another trainroom version?): {exc}"
            ) from None


class SshDialer:
    def dial(self, address: str) -> tuple[socket.socket, KeeperWord]:
        from trainroom.core.remote import ssh
        from trainroom.core.remote.target import TargetError, resolve_target

        try:
            sock, hello = ssh.dial(resolve_target(address))
        except ssh.Unreachable as exc:
            raise KeeperUnreachable(str(exc)) from None
        except (ssh.RemoteRefused, TargetError) as exc:
            raise KeeperGone(str(exc)) from None
        return sock, hello.keeper

    def dropped(self, sock: socket.socket) -> bool:
        """ssh's exit says which: the bridge ends cleanly when the keeper closed."""
        from trainroom.core.remote import ssh

        return isinstance(sock, ssh.BridgeSocket) and sock.link_dropped()


def install() -> None:
    """Let this process's read model reach runs and keepers on other hosts (idempotent)."""
    if store.REMOTE is None:
        store.REMOTE = SshRuns()
    if client.DIALER is None:
        client.DIALER = SshDialer()

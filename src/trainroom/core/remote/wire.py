"""What the bridge says before it relays: the run it resolved on its host, and its keeper.

`trainroom bridge [RUN]` (the remote end, run by ssh) writes one `BridgeHello` frame (the
keeper protocol's length prefix) on stdout, then relays frames both ways between its stdio and
the keeper's Unix socket, byte for byte, the way `docker system dial-stdio` does. When the keeper
is gone it answers a subscribe from the run's journal and refuses a request, saying why.
"""

from __future__ import annotations

import msgspec

from trainroom.core.vocab import KeeperWord
from trainroom.core.wire import protocol as p

BRIDGE_VERSION = 1


class BridgeHello(msgspec.Struct, tag="bridge-hello", kw_only=True, omit_defaults=True):
    v: int = BRIDGE_VERSION
    protocol: int = p.PROTOCOL_VERSION
    host: str
    ok: bool = True
    error: str | None = None  # why no run could be resolved (then the bridge exits)
    run_id: str | None = None
    run_dir: str | None = None
    created: float | None = None
    argv: list[str] = []
    keeper: KeeperWord = "gone"
    job: str | None = None  # the run's job name (launch --job), if any
    node_rank: int | None = None


hello_decoder = msgspec.msgpack.Decoder(BridgeHello)


def read_hello(data: bytes) -> BridgeHello:
    return hello_decoder.decode(data)

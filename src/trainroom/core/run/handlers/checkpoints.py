"""The fold of a checkpoint's states (CheckpointState; a reporter's Checkpoint is a candidate)."""

from __future__ import annotations

from typing import Protocol

from trainroom.core.run.parts import CheckpointView
from trainroom.core.wire import protocol as p


class Run(Protocol):
    """What the checkpoint handler reads and writes of the run's state."""

    checkpoints: list[CheckpointView]

    def checkpoint(self, path: str) -> CheckpointView | None: ...


def _checkpoint(st: Run, r: p.CheckpointState) -> None:
    c = st.checkpoint(r.path)
    if c is None:
        st.checkpoints.append(
            CheckpointView(
                path=r.path,
                step=r.step,
                state=r.state,
                t=r.t,
                reason=r.reason,
                size_bytes=r.size_bytes,
                digest=r.digest,
                report=r.report,
                eval=r.eval,
            )
        )
        return
    if r.state != "candidate" and c.state == "candidate" and _older(r.step, c.step):
        # A verdict on an older version of a path saved over since (Lightning's last.ckpt,
        # nanoGPT's ckpt.pt): the newer one is still to be verified (the pipeline runs again).
        return
    c.state, c.t = r.state, r.t
    c.reason = r.reason
    if r.step is not None:
        c.step = r.step
    if r.size_bytes is not None:
        c.size_bytes = r.size_bytes
    if r.digest is not None:
        c.digest = r.digest
    if r.report is not None:
        c.report = r.report
    if r.eval is not None:
        c.eval = r.eval


def _older(step: int | None, than: int | None) -> bool:
    return step is not None and than is not None and step < than

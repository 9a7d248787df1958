"""Every panel of the control room, found once (a DOM query per panel per render is a real
share of the TUI's CPU), and Tab's order through them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.app import App
from textual.widget import Widget

from .widgets.banner import DisconnectBanner
from .widgets.base import PANEL_ORDER
from .widgets.cadence import CadencePanel
from .widgets.disk import DiskPanel
from .widgets.findings import FindingsPanel
from .widgets.header import RunHeader
from .widgets.host import HostPanel
from .widgets.keystrip import KeyStrip
from .widgets.logtail import LogTailPanel
from .widgets.loss import LossPanel
from .widgets.lr import LrPanel
from .widgets.ranks import RanksPanel
from .widgets.trainer import TrainerPanel
from .widgets.vram import VramPanel


@dataclass(frozen=True)
class Panels:
    """Every panel, found once: a DOM query per panel per render is a real share of the TUI's CPU."""

    header: RunHeader
    trainer: TrainerPanel
    vram: VramPanel
    cadence: CadencePanel
    lr: LrPanel
    host: HostPanel
    disk: DiskPanel
    findings: FindingsPanel
    loss: LossPanel
    ranks: RanksPanel
    log: LogTailPanel
    banner: DisconnectBanner
    keys: KeyStrip

    @classmethod
    def of(cls, app: App[Any]) -> Panels:
        q = app.query_one
        return cls(
            header=q(RunHeader),
            trainer=q(TrainerPanel),
            vram=q(VramPanel),
            cadence=q(CadencePanel),
            lr=q(LrPanel),
            host=q(HostPanel),
            disk=q(DiskPanel),
            findings=q(FindingsPanel),
            loss=q(LossPanel),
            ranks=q(RanksPanel),
            log=q(LogTailPanel),
            banner=q(DisconnectBanner),
            keys=q(KeyStrip),
        )

    def clear_views(self) -> None:
        """Every run panel shows nothing (another run is opened): all but the banner and the keys."""
        for name in ("header", "trainer", "vram", "cadence", "lr", "host", "disk", "findings"):
            getattr(self, name).view = None
        self.loss.view, self.ranks.view, self.log.view = None, None, None

    def in_order(self) -> list[Widget]:
        """The focusable panels in Tab's order."""
        return [getattr(self, name) for name in PANEL_ORDER]

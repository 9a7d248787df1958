"""The run picker: several live runs and no run named, so the user picks one."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from trainroom.core.run.store import RunInfo
from trainroom.core.run.summary import RunSummary
from trainroom.tui import fmt


def _row(r: RunInfo, s: RunSummary | None) -> str:
    """A run as one line: id, start, and (from its summary, no journal read) state and step."""
    where = ""
    if s is not None:
        step = f" step {s.step}" if s.step is not None else ""
        worst = f" {s.worst.code}" if s.worst is not None else ""
        where = f"  {s.status}{step}{worst}"
    return f"{r.run_id}  started {fmt.clock(r.created)}{where}  {fmt.shorten(' '.join(r.argv), 40)}"


class RunPicker(ModalScreen[RunInfo | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "cancel", id="trainroom.picker.cancel", tooltip="Pick no run"),
    ]

    def __init__(self, runs: list[RunInfo], summaries: dict[str, RunSummary | None] | None = None) -> None:
        super().__init__()
        self.runs = sorted(runs, key=lambda r: r.created, reverse=True)
        self.summaries = summaries or {}

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box", classes="modal-box"):
            yield Label(f"{len(self.runs)} live runs: pick one", id="picker-title")
            yield OptionList(
                *(Option(_row(r, self.summaries.get(r.run_id)), id=r.run_id) for r in self.runs),
                id="picker-list",
            )
            yield Label("enter: watch it · esc: none", classes="modal-hint")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(next(r for r in self.runs if r.run_id == event.option.id))

    def action_cancel(self) -> None:
        self.dismiss(None)

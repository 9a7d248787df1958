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
from trainroom.tui import fmt


class RunPicker(ModalScreen[RunInfo | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "cancel", id="trainroom.picker.cancel", tooltip="Pick no run"),
    ]

    def __init__(self, runs: list[RunInfo]) -> None:
        super().__init__()
        self.runs = sorted(runs, key=lambda r: r.created, reverse=True)

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box", classes="modal-box"):
            yield Label(f"{len(self.runs)} live runs: pick one", id="picker-title")
            yield OptionList(
                *(
                    Option(
                        f"{r.run_id}  started {fmt.clock(r.created)}  {fmt.shorten(' '.join(r.argv), 50)}",
                        id=r.run_id,
                    )
                    for r in self.runs
                ),
                id="picker-list",
            )
            yield Label("enter: watch it · esc: none", classes="modal-hint")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(next(r for r in self.runs if r.run_id == event.option.id))

    def action_cancel(self) -> None:
        self.dismiss(None)

"""The arguments a key needs and does not have: one line each, asked with the argument's own help
and CLI flag as the placeholder, checked as the CLI and the keeper check them (the field's parser,
then the action's `Args` type and `validate`), the reason said under the lines until it is right.
Dismissed with the typed values (Enter), or None (Esc: nothing is asked of the keeper)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from trainroom.core.actions.options import Option
from trainroom.core.actions.registry import REGISTRY


def checked(action: str, given: Mapping[str, Any], typed: Mapping[Option, str]) -> dict[str, Any] | str:
    """The arguments `typed` (each option's word) adds to `given`, or why they cannot be used,
    in the words the CLI says (the flag, then the parser's or the keeper's reason)."""
    act = REGISTRY[action]
    values: dict[str, Any] = {}
    for opt, text in typed.items():
        try:
            values[opt.name] = opt.parse(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            return f"{opt.flag}: {exc}"
    args = act.args_of({**given, **values})
    if isinstance(args, str):
        return args
    why = act.validate(args)
    return f"{action}: {why}" if why is not None else values


class AskArgs(ModalScreen[dict[str, Any] | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape", "dismiss(None)", "cancel", id="trainroom.ask.cancel", tooltip="Close, doing nothing"
        ),
    ]

    def __init__(self, action: str, asked: list[Option], given: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.action_name = action
        self.asked = asked
        self.given = dict(given or {})

    def compose(self) -> ComposeResult:
        spec = REGISTRY[self.action_name].spec
        with Vertical(id="ask-box", classes="modal-box"):
            yield Label(f"{self.action_name}: {spec.description}", id="ask-title", markup=False)
            for opt in self.asked:
                yield Label(opt.arg.help, classes="ask-help", markup=False)
                yield Input(placeholder=opt.flag.removeprefix("--"), id=f"ask-{opt.name}")
            yield Label("", id="ask-why", markup=False)
            yield Label("enter: go on · esc: cancel, nothing done", classes="modal-hint")

    def on_mount(self) -> None:
        self.query(Input).first().focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        typed = {opt: self.query_one(f"#ask-{opt.name}", Input).value for opt in self.asked}
        empty = next((opt for opt, text in typed.items() if not text), None)
        if empty is not None:
            self.query_one(f"#ask-{empty.name}", Input).focus()
            self.query_one("#ask-why", Label).update(f"{empty.flag}: needed")
            return
        out = checked(self.action_name, self.given, typed)
        if isinstance(out, str):
            self.query_one("#ask-why", Label).update(out)
            return
        self.dismiss(out)

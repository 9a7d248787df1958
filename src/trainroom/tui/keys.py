"""The control room's keys: each keeper action's and each moving key, to the part that does it
(`flow`, `nav`), and which actions apply now (why not, on what target, through which keeper)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from textual.app import SystemCommand
from textual.screen import Screen

from trainroom.core.run import store as runs_store
from trainroom.core.run.attach import take_up
from trainroom.core.run.store import RunError

from . import verdict
from .bindings import COMMANDS, KEEPER_ACTIONS, key_label, key_of
from .link import KeeperLink
from .room import Room
from .screens import lazy as screens  # each screen loads when first opened, after the first frame
from .verdict import FindingRow, Situation
from .widgets.findings import FindingsPanel
from .widgets.trainer import TrainerPanel


class RoomKeys(Room):
    """What the control room's keys do, and whether an action's key acts now."""

    # ------------------------------------------------------------------ the keys, to the parts
    # (each keeper action's key is `act`, bound below the class for every action of the registry)

    def act(self, action: str) -> None:
        """A keeper action's key: on the finding whose own target it acts on now, if any."""
        self.flow.start(action, self.key_target(action))

    def action_next_panel(self) -> None:
        self.nav.move_focus(1)

    def action_previous_panel(self) -> None:
        self.nav.move_focus(-1)

    def action_zoom(self) -> None:
        self.nav.zoom()

    def action_search(self) -> None:
        self.nav.search()

    def action_log_scale(self) -> None:
        self.nav.log_scale()

    def action_recent_window(self) -> None:
        self.nav.recent_window()

    def action_runs(self) -> None:
        self.nav.runs()

    def action_jump(self, n: int) -> None:
        self.nav.jump(n)

    # ------------------------------------------------------------------ which actions apply

    def key_text(self, action: str) -> str:
        """The key `action` is on now, as the screen writes it (`^k`, `R`)."""
        return key_label(key_of(action, self.keys_in_use))

    def situation(self) -> Situation:
        return Situation(connected=self.connected, busy=self.flow.current, has_run=self.run_info is not None)

    def why_not(self, action: str, finding: str | None = None) -> str | None:
        return verdict.refusal(self.state, action, self.situation(), finding)

    def key_target(self, action: str) -> FindingRow | None:
        return self._target_of(self.findings_now.open if self.findings_now is not None else (), action)

    def _target_of(self, rows: tuple[FindingRow, ...], action: str = "kill") -> FindingRow | None:
        """What an action's key acts on (a kill's): the finding under the cursor when the findings
        have the focus (its target when it names one, else the trainer); the trainer when the
        trainer panel has it; otherwise the first finding that names a target, else the trainer."""
        targeted = [r for r in rows if r.action == action and r.targeted]
        focused = self.focused
        if isinstance(focused, FindingsPanel):
            row = focused.selected_row()
            return next((r for r in targeted if row is not None and r.ident == row.ident), None)
        if isinstance(focused, TrainerPanel):
            return None
        return targeted[0] if targeted else None

    def keeper_link(self) -> KeeperLink:
        if self.run_watch.link is not None:
            return self.run_watch.link
        if self.run_info is None:
            raise RunError("no run to act on")
        info = self.run_info
        resuming = self.flow.current == "resume"
        if (
            resuming
            and not self.connected
            and not info.remote
            and not runs_store.resolve_run(info.run_id).alive
        ):
            # Only a resume acts with the keeper gone (verdict.refusal): a new keeper takes the
            # run up (same run, its journal) and the resume goes through it as the next attempt.
            info = take_up(info)
        return self.source.connect(info)  # the keeper may be back; if not, this says so

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """Each command once: Textual's own, less those the control room has its own key for."""
        ours = {"Quit", "Maximize", "Minimize", "Keys"}
        for command in super().get_system_commands(screen):
            if command.title not in ours:
                yield command
        for c in COMMANDS:
            if c.action == "next_theme":
                continue  # Textual's "Theme" picks one, with a preview
            why = self.why_not(c.action) if c.action in KEEPER_ACTIONS else None
            help_text = c.tooltip + (f" (not now: {why})" if why else "")
            yield SystemCommand(
                f"{c.label.capitalize()} ({self.key_text(c.action)})",
                help_text,
                partial(self.run_action, c.action),
            )

    def action_help(self) -> None:
        self.push_screen(screens.help()({a: self.why_not(a) for a in KEEPER_ACTIONS}, self.keys_in_use))

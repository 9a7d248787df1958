"""The command line's verbs (`:`), each carried out exactly as its key is: a keeper action through
the same action flow (the keeper's plan, the same confirmation), the room's commands through the
same app actions. What the line adds is arguments (`:prune keep 3`, `:theme light`) and the names
of things without a key (`:job`: the runs overview filtered to this run's job). A mixin, so the
app stays the size it is."""

from __future__ import annotations

import argparse
import shlex
from typing import Any, Protocol, cast

from textual.app import App

from trainroom.core.actions import options
from trainroom.core.actions.registry import NAMES as KEEPER_ACTIONS
from trainroom.core.actions.registry import REGISTRY
from trainroom.core.run.state import RunState
from trainroom.core.run.store import RunInfo

from .bindings import COMMANDS
from .theming import LoadedThemes, remember, short_name

OWN_VERBS = ("job", "theme")


class Acts(Protocol):
    def start_args(self, action: str, args: dict[str, object], question: str | None = None) -> None: ...


class Navigates(Protocol):
    def runs(self, filter_text: str | None = None) -> None: ...


def _app(mixin: object) -> Any:
    """The control room this is mixed into (its App methods and parts: the flow, the keys)."""
    return cast(App[int], mixin)


def action_args(verb: str, words: list[str]) -> dict[str, object] | str:
    """`:prune keep 3`, `:kill pid 4242 signal STOP`: an action's arguments as `NAME VALUE`
    pairs (each named as its CLI flag is, without the dashes), each read by the argument's own
    parser and checked by the action's `Args`; or why not, in words."""
    act = REGISTRY[verb]
    opts = {o.flag.removeprefix("--"): o for o in options.options(act.Args) if o.arg.cli}
    usage = (
        f"say `{verb} "
        + " ".join(
            f"[{n} {'yes|no' if o.base is bool else n.upper().replace('-', '_')}]" for n, o in opts.items()
        )
        + f"`, or `{verb}`"
    )
    if not opts:
        return f"{verb} takes no arguments"
    if len(words) % 2:
        return usage
    values: dict[str, object] = {}
    for name, text in zip(words[::2], words[1::2], strict=True):
        opt = opts.get(name)
        if opt is None:
            return f"{verb} has no argument {name!r}: {usage}"
        try:
            values[opt.name] = opt.parse(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            return f"{name}: {exc}"
    typed = act.args_of(values, complete=False)
    if isinstance(typed, str):
        return typed
    why = act.validate(typed)
    return f"{verb}: {why}" if why is not None else values


def verbs() -> list[str]:
    return sorted({c.name for c in COMMANDS if c.name != "command"} | set(OWN_VERBS))


class CommandLineKey:
    """Mixed into the control room (an `App`)."""

    state: RunState | None
    run_info: RunInfo | None
    loaded_themes: LoadedThemes

    def action_command_line(self) -> None:
        app = _app(self)
        run = self.run_info.run_id if self.run_info is not None else "no run"
        focused = app.focused
        panel = f" › {focused.id}" if focused is not None and focused.id else ""
        themes = [f"theme {n}" for n in self.loaded_themes.short_names()]
        suggestions = [*verbs(), "prune keep 3", "resume", *themes]
        from .screens.cmdline import CommandLine  # loaded when first opened

        app.push_screen(CommandLine(f"runs › {run}{panel}", verbs(), suggestions), self.command_entered)

    def command_entered(self, line: str | None) -> None:
        app = _app(self)
        if not line:
            return
        try:
            words = shlex.split(line.removeprefix(":"))
        except ValueError as exc:
            app.notify(f":{line}: {exc}", severity="warning", timeout=4, markup=False)
            return
        if not words:
            return
        verb, args = words[0].lower(), words[1:]
        why = self._cmd_carry_out(verb, args)
        if why is not None:
            app.notify(f":{line}: {why}", severity="warning", timeout=5, markup=False)

    def _cmd_carry_out(self, verb: str, args: list[str]) -> str | None:
        """Do what `verb` says, as its key would; why not, in words."""
        app = _app(self)
        flow: Acts = app.flow  # the app's ActionFlow
        if verb == "resume" and args:
            return self._cmd_resume(args)
        if verb in REGISTRY and args:
            given = action_args(verb, args)
            if isinstance(given, str):
                return given
            flow.start_args(verb, given)  # a required argument not given is asked for, as the key does
            return None
        if verb == "theme" and args:
            return self._cmd_theme(args[0])
        if verb == "job":
            return self._cmd_job()
        if args:
            return f"{verb} takes no arguments"
        command = next((c for c in COMMANDS if c.name == verb or c.action == verb), None)
        if command is None or command.name == "command":
            return f"no such command (the commands: {', '.join(verbs())})"
        if command.action in KEEPER_ACTIONS:
            app.act(command.action)  # the key's own path
        else:
            app.call_later(app.run_action, command.action)
        return None

    def _cmd_resume(self, args: list[str]) -> str | None:
        """`:resume STEP`: the resume key's, when STEP is the checkpoint it resumes from (the
        last verified one); any other step is said, not silently replaced by that one."""
        st = self.state
        last = st.last_verified() if st is not None else None
        if len(args) != 1 or not args[0].isdigit():
            return "say `resume` or `resume STEP` (the step of the last verified checkpoint)"
        if last is None:
            return "no verified checkpoint to resume from"
        if int(args[0]) != last.step:
            return f"a resume starts from the last verified checkpoint, step {last.step}, not step {args[0]}"
        _app(self).act("resume")
        return None

    def _cmd_theme(self, name: str) -> str | None:
        app = _app(self)
        found = self.loaded_themes.find(name)
        if found is None:
            return f"unknown theme (available: {', '.join(self.loaded_themes.short_names())})"
        app.theme = found.name
        said = remember(found.name)
        app.notify(f"theme: {short_name(found.name)}" + (f" ({said})" if said else ""), timeout=2)
        return None

    def _cmd_job(self) -> str | None:
        st = self.state
        job = st.options.job if st is not None else None
        if job is None:
            return "this run is no node of a job (`launch --job NAME` makes one; `trainroom job --tui` shows one)"
        nav: Navigates = _app(self).nav  # the app's Navigation
        nav.runs(f"job {job.name}")
        return None

"""An action is its own module and one registry line: a test's own action with a required argument
(`note --text`), added with `registry.register` as the registry line adds the others, gets its CLI
option (flag, type, help; a bad or missing one exits 2 in one line) and its docs row from its
`Args`, and its control-room key asks for the argument it lacks (checked by the same parser and
`Args` type), then plans, confirms and carries out through the real `Action.serve`.

The control room binds every action's key when it is imported, as it does for an action of the
registry's: the registration and the drive run in a fresh interpreter (`main` below), never in the
pytest process whose control room was imported without it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import msgspec

from trainroom.core.actions.base import Action, ActionSpec, Args, Call, Keeper, Outcome, Plan, Refused, arg
from trainroom.core.configuration import argtypes
from trainroom.core.wire import protocol as p

REPO = Path(__file__).resolve().parents[2]


class NoteArgs(Args, kw_only=True):
    text: Annotated[str | None, arg("the words to write beside the run", required=True)] = None
    times: Annotated[int | None, arg("how many times to write them (1 to 9)", parse=argtypes.count(1, 9))] = (
        None
    )


class NoteShown(msgspec.Struct, kw_only=True):
    path: str
    text: str
    times: int = 1


class Note(Action[NoteArgs, None, NoteShown]):
    spec = ActionSpec(
        name="note",
        key="W",
        description="Write a note beside the run (a test's own action)",
        destructive=True,
        question="Write this note?",
    )
    Args = NoteArgs
    Target = NoteShown

    def __init__(self, out: str) -> None:
        self.out = out

    def validate(self, args: NoteArgs) -> str | None:
        return "say what to do, not TODO" if args.text is not None and args.text.lower() == "todo" else None

    async def plan(self, k: Keeper, args: NoteArgs, call: Call) -> Plan[None, NoteShown] | Refused:
        assert args.text is not None
        shown = NoteShown(path=self.out, text=args.text, times=args.times or 1)
        return Plan(f"write {args.text!r} to {self.out}", shown, None)

    async def execute(self, k: Keeper, args: NoteArgs, plan: Plan[None, NoteShown], call: Call) -> Outcome:
        Path(plan.target.path).write_text(plan.target.text * plan.target.times)
        return Outcome(
            True, f"wrote {plan.target.text!r}", after={"written_bytes": Path(self.out).stat().st_size}
        )

    def headline(self, plan: NoteShown, summary: str) -> str:
        return f"writes {plan.text!r} {plan.times} time(s) to {plan.path}"


def _cli(facts: dict[str, Any]) -> None:
    import contextlib
    import io

    from trainroom.core.actions import options
    from trainroom.core.actions.registry import markdown_table
    from trainroom.core.cli import main as cli
    from trainroom.core.cli.subcommands import LazySubcommands, full_index

    # `trainroom`'s parser, its verb index as `scripts/verb_index.py --write` makes it (the
    # shipped verbindex.py is generated for the registry without the test's action).
    index = full_index()
    facts["index"] = [e for e in index if e[0] == "note"]

    def build_parser() -> Any:
        ap = cli.top_parser()
        sub = ap.add_subparsers(dest="cmd", action=LazySubcommands)
        sub.offer(cli.VERBS, index, cli.open_tui)
        return ap

    ap = build_parser()
    facts["cli_args"] = options.given(
        NoteArgs, ap.parse_args(["note", "r1", "--text", "hello", "--times", "3"])
    )
    verbs = next(a for a in ap._actions if a.dest == "cmd")
    facts["cli_help"] = verbs.choices["note"].format_help()  # type: ignore[index]
    for argv, key in (
        (["note", "r1"], "cli_missing"),
        (["note", "r1", "--text", "x", "--times", "0"], "cli_bad"),
    ):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                build_parser().parse_args(argv)
        except SystemExit as exc:
            facts[key] = [exc.code, err.getvalue().strip().splitlines()[-1]]
    facts["docs_row"] = next(r for r in markdown_table().splitlines() if r.startswith("| `note`"))


async def _tui(facts: dict[str, Any], run_dir: str, note: Note) -> None:
    from textual.widgets import Input, Label

    from tests.support.tui_fakes import healthy_records, make_app, screen_text, settle, until
    from trainroom.core.actions.registry import REGISTRY
    from trainroom.tui.screens.ask import AskArgs
    from trainroom.tui.screens.cmdline import CommandLine
    from trainroom.tui.screens.confirm import ConfirmAction
    from trainroom.tui.screens.result import ActionResult

    def keeper(action: str, args: dict[str, Any], confirm: bool) -> list[p.Reply]:
        # The action's own serve answers, as the keeper's loop calls it (precondition, plan,
        # the confirmed plan decoded and compared, execute).
        said: list[p.Reply] = []
        k: Any = SimpleNamespace(run=SimpleNamespace(state=app.state))
        req = p.Request(id=len(link.requests), action=action, args=args, confirm=confirm)
        asyncio.run(REGISTRY[action].serve(k, req, said.append, "tui"))
        return said

    app, link, _ = make_app(run_dir, healthy_records(steps=10), replier=keeper)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("W")
        await until(pilot, lambda: isinstance(app.screen, AskArgs), "the note key asking for its text")
        await pilot.pause()
        facts["asked"] = screen_text(app)
        facts["asked_fields"] = [i.id for i in app.screen.query(Input)]
        await pilot.press("enter")  # nothing typed
        facts["why_empty"] = str(app.screen.query_one("#ask-why", Label).render())
        await pilot.press(*"todo", "enter")  # the action's own validate says no
        facts["why_blank"] = str(app.screen.query_one("#ask-why", Label).render())
        facts["asked_keeper_before"] = list(link.requests)
        app.screen.query_one("#ask-text", Input).value = ""
        await pilot.press(*"hello", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the note's confirmation")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ConfirmAction)
        facts["confirm"] = [screen.question, screen.headline]
        await pilot.press("y")
        await until(pilot, lambda: isinstance(app.screen, ActionResult), "the note's result")
        facts["requests"] = [
            [a, {k: v for k, v in args.items() if k != "expect"}, c] for a, args, c in link.requests
        ]
        facts["expect"] = link.requests[-1][1].get("expect")
        # Esc on the question asks the keeper nothing.
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ActionResult), "the result closed")
        await until(pilot, lambda: app.flow.current is None, "the flow released")
        n = len(link.requests)
        await pilot.press("W")
        await until(pilot, lambda: isinstance(app.screen, AskArgs), "asked again")
        await pilot.press("escape")
        await until(pilot, lambda: app.flow.current is None, "cancelled")
        facts["after_escape"] = len(link.requests) - n
        # The command line gives the arguments by name; the one it lacks is asked for the same way.
        await pilot.press("colon")
        await until(pilot, lambda: isinstance(app.screen, CommandLine), "the command line")
        await pilot.press(*"note times 2", "enter")
        await until(pilot, lambda: isinstance(app.screen, AskArgs), "the text asked for")
        await pilot.press(*"hi", "enter")
        await until(pilot, lambda: isinstance(app.screen, ConfirmAction), "the line's confirmation")
        facts["line_confirm"] = app.screen.headline  # type: ignore[attr-defined]
        facts["line_request"] = link.requests[-1]
        await pilot.press("n")
        await until(pilot, lambda: app.flow.current is None, "released")
    facts["written"] = Path(note.out).read_text()


def main(run_dir: str) -> None:
    """In a fresh interpreter: the registry line for the test's action, then both clients."""
    from trainroom.core.actions import registry

    note = Note(os.path.join(run_dir, "note.txt"))
    registry.register(note)
    facts: dict[str, Any] = {}
    _cli(facts)
    asyncio.run(_tui(facts, run_dir, note))
    print(json.dumps(facts))


def test_an_action_with_an_argument_is_its_module_and_a_registry_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    code = f"from tests.tui.test_action_args import main; main({str(tmp_path)!r})"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])

    # The CLI: its options are the Args' (flag, type, help), checked before anything is asked.
    assert facts["index"] == [
        ["note", "Write a note beside the run (a test's own action)", "trainroom.core.cli.act:add_parsers"]
    ]
    assert facts["cli_args"] == {"text": "hello", "times": 3}
    assert "--text TEXT" in facts["cli_help"] and "the words to write beside the run" in facts["cli_help"]
    assert "how many times to write them (1 to 9)" in facts["cli_help"]
    code, line = facts["cli_missing"]
    assert code == 2 and "--text" in line and "required" in line, line
    code, line = facts["cli_bad"]
    assert code == 2 and "argument --times: expected a whole number in [1, 9], got '0'" in line, line
    assert facts["docs_row"].endswith("| `--text TEXT` (required), `--times TIMES` |"), facts["docs_row"]

    # The control room: the key asks for the text (never names a CLI flag to go and use), says
    # why a blank one will not do, asks the keeper nothing until the text is right.
    assert facts["asked_fields"] == ["ask-text"]
    assert "the words to write beside the run" in facts["asked"] and "needs --text" not in facts["asked"]
    assert facts["why_empty"] == "--text: needed"
    assert facts["why_blank"] == "note: say what to do, not TODO"
    assert facts["asked_keeper_before"] == []
    # Then the plan, the confirmation in the action's words, and exactly that plan carried out.
    assert facts["confirm"][0] == "Write this note?"
    assert facts["confirm"][1].startswith("writes 'hello' 1 time(s) to ")
    assert facts["requests"] == [["note", {"text": "hello"}, False], ["note", {"text": "hello"}, True]]
    assert facts["expect"] == {"path": str(tmp_path / "note.txt"), "text": "hello", "times": 1}
    assert facts["written"] == "hello"
    assert facts["after_escape"] == 0
    assert facts["line_confirm"].startswith("writes 'hi' 2 time(s) to ")
    assert facts["line_request"] == ["note", {"times": 2, "text": "hi"}, False]

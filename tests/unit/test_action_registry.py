"""The action registry: one module per action, read by the keeper, the CLI, the control room and
the docs; each action's precondition in the words every client shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from tests.support.run_builder import RunBuilder
from trainroom.core.actions.base import Action
from trainroom.core.actions.registry import CANCELLABLE, NAMES, REGISTRY, SPECS, markdown_table
from trainroom.core.cli import verbindex
from trainroom.core.cli.main import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs" / "actions.md"


def test_the_docs_table_is_the_registry() -> None:
    text = DOCS.read_text()
    begin, end = "<!-- actions:begin -->\n", "<!-- actions:end -->"
    assert text.count(begin) == 1 and text.count(end) == 1
    block = text[text.index(begin) + len(begin) : text.index(end)]
    assert block == markdown_table()
    for s in SPECS:
        assert f"| `{s.name}` | `{s.key}` | {s.description} |" in block


def test_every_action_is_one_module_with_a_spec_and_typed_arguments() -> None:
    # Whatever the count: every action once, by its own name and key, in a module of its own,
    # in the docs table (above) and, when it is a CLI verb, in the verbs `--help` lists.
    assert tuple(REGISTRY) == NAMES and len(set(NAMES)) == len(NAMES)
    assert {"kill", "reclaim", "prune", "resume", "dump", "continue", "verify", "bench"} <= set(NAMES)
    assert len({s.key for s in SPECS}) == len(SPECS)
    listed = {name for name, _help, _where in verbindex.INDEX}
    modules = set()
    for name, action in REGISTRY.items():
        assert isinstance(action, Action) and action.spec.name == name
        assert issubclass(action.Args, msgspec.Struct)
        assert f"| `{name}` |" in markdown_table()
        assert not action.spec.cli_verb or name in listed, name
        modules.add(type(action).__module__)
    assert len(modules) == len(REGISTRY)
    # A prune is never cut off half-way; the long ones can be.
    assert "prune" not in CANCELLABLE
    assert {"bench", "verify", "dump", "resume", "kill"} <= set(CANCELLABLE)


def test_the_cli_verbs_help_and_cancel_come_from_the_registry() -> None:
    ap = build_parser()
    sub = next(a for a in ap._actions if a.dest == "cmd")
    choices = sub.choices  # type: ignore[attr-defined]
    for name, action in REGISTRY.items():
        assert name in choices
        if action.spec.cli_verb:
            helps = {c.dest: c.help for c in sub._choices_actions}  # type: ignore[attr-defined]
            assert helps[name] == action.spec.description
    cancel = next(a for a in choices["cancel"]._actions if a.dest == "cancel_action")
    assert tuple(cancel.choices) == CANCELLABLE
    args = ap.parse_args(["kill", "r1", "--grace", "3", "--finding", "DUPLICATE_TRAINER:trainer"])
    assert (args.action, args.grace_s, args.finding) == ("kill", 3.0, "DUPLICATE_TRAINER:trainer")


def test_a_dead_trainer_offers_no_resume_without_a_verified_checkpoint_and_no_kill() -> None:
    b = RunBuilder()
    b.start()
    b.end(exit_signal=9)
    st = b.run
    resume, kill = REGISTRY["resume"], REGISTRY["kill"]
    assert resume.refusal(st, {}) is None  # the keeper still plans (a `latest` it may find)
    why = resume.refusal(st, {}, offer=True)
    assert why is not None and "no verified checkpoint" in why and "trainroom launch" in why
    # A kill of a trainer that is gone is a check the keeper carries out, not a fix to offer.
    assert kill.refusal(st, {}) is None
    assert (
        kill.refusal(st, {}, offer=True) == "the trainer is not running (attempt 1 ended: killed by SIGKILL)"
    )
    b.verified(10)
    assert resume.refusal(st, {}, offer=True) is None


def test_preconditions_of_a_live_trainer() -> None:
    b = RunBuilder()
    b.start()
    st = b.run
    assert REGISTRY["resume"].refusal(st, {}) == "attempt 1 is still running: kill it first"
    assert REGISTRY["kill"].refusal(st, {}, offer=True) is None
    assert REGISTRY["dump"].refusal(st, {}) is None
    assert REGISTRY["continue"].refusal(st, {}) == f"nothing is stopped: the run is {st.status}"
    assert REGISTRY["dump"].refusal(st, {"rank": 3}) == "rank 3 has no connected reporter in attempt 1"
    assert REGISTRY["kill"].refusal(st, {"finding": "DUPLICATE_TRAINER:x"}) == (
        "finding 'DUPLICATE_TRAINER:x' is not open (it cleared, or never was)"
    )
    # Arguments are typed: a wrong type is refused before anything is planned.
    assert "bad arguments" in (REGISTRY["kill"].refusal(st, {"grace_s": "soon"}) or "")
    assert (
        REGISTRY["kill"].refusal(st, {"grace_s": 7200}) == "grace_s must be seconds in [0, 3600], got 7200.0"
    )


def test_a_death_before_any_checkpoint_offers_no_resume_key_and_the_farewell_says_start_again() -> None:
    from trainroom.core.findings import Finding
    from trainroom.core.wire import protocol as p
    from trainroom.tui import verdict

    b = RunBuilder()
    b.start()
    b.end(exit_signal=9)
    b.apply(
        p.FindingRaised(finding=Finding(code="DEAD", severity="critical", message="died", action="resume"))
    )
    where = verdict.Situation(connected=True)
    (row,) = verdict.findings_view(b.run, lambda a: a.upper(), where)
    assert row.key is None and row.why_not is not None and "no verified checkpoint" in row.why_not
    assert "start again: trainroom launch" in verdict.farewell("r1", b.run, connected=True)
    assert "trainroom resume" not in verdict.farewell("r1", b.run, connected=True)
    b.verified(10)
    (row,) = verdict.findings_view(b.run, lambda a: a.upper(), where)
    assert row.key == "RESUME" and row.why_not is None
    assert "  resume it:  trainroom resume r1" in verdict.farewell("r1", b.run, connected=True)


def test_the_keeper_refuses_in_the_words_the_control_room_shows() -> None:
    """One precondition: the keeper's refusal and the control room's "not now" are the same words."""
    import asyncio
    from types import SimpleNamespace

    from trainroom.core.wire import protocol as p
    from trainroom.tui import verdict

    b = RunBuilder()
    b.start()
    b.end(exit_signal=9)
    keeper: Any = SimpleNamespace(run=SimpleNamespace(state=b.run))
    where = verdict.Situation(connected=True)

    async def ask(action: str) -> p.Reply:
        said: list[p.Reply] = []
        req = p.Request(id=1, action=action, args={}, confirm=False)
        await REGISTRY[action].serve(keeper, req, said.append, "test")
        (done,) = said
        return done

    for action in ("dump", "continue"):
        done = asyncio.run(ask(action))
        why = verdict.refusal(b.run, action, where)
        assert why == "the trainer is not running (attempt 1 ended: killed by SIGKILL)"
        assert done.stage == "done" and not done.ok and done.message == f"{action} refused: {why}"


def test_a_confirmation_is_of_the_target_and_only_a_signal_narrows() -> None:
    from trainroom.core.wire import protocol as p

    said: list[p.Reply] = []

    def confirmed(req: p.Request, plan: dict[str, Any]) -> bool:
        # As `serve` calls it: the plan and the confirmed one decoded off the wire, typed.
        act = REGISTRY[req.action]
        return act.confirmed(req, said.append, act.decode(plan), act.decode(req.args.get("expect")))

    shown = {"pgid": 10, "members": [{"pid": 10, "start_ticks": 1}, {"pid": 11, "start_ticks": 2}]}
    now = {"pgid": 10, "members": [{"pid": 10, "start_ticks": 1}, {"pid": 12, "start_ticks": 3}]}
    req = p.Request(id=1, action="kill", args={"expect": shown}, confirm=True)
    assert confirmed(req, shown) and not said
    assert confirmed(req, {"pgid": 10, "members": shown["members"][:1]})
    assert not confirmed(req, now)
    assert "confirmed pids [10, 11] of pgid 10, now [10, 12] of pgid 10" in said[-1].message
    # A bench has nothing that could change under it: no plan to carry.
    bench_req = p.Request(id=2, action="bench", args={}, confirm=True)
    assert confirmed(bench_req, {"device": "cpu", "python": "python"})
    assert not confirmed(p.Request(id=3, action="prune", args={}, confirm=True), {"root": "/r"})
    # A confirmed plan of another shape (not a kill plan) is no confirmation either.
    assert not confirmed(p.Request(id=4, action="kill", args={"expect": {"pgid": "x"}}, confirm=True), shown)
    assert "args.expect" in said[-1].message

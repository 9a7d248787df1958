"""The `trainroom` command loads a verb only when it runs: `--help` lists every verb from the
generated index (kept current here), the lazy parser is the eager one (every verb's help, options
and defaults), and the heavy modules stay out of `import trainroom`, `--help` and `status`
(checked by `sys.modules` in a fresh interpreter, never by time: scripts/bench_cli.py measures)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.synthetic import make_run_dir, run_records, write_run
from trainroom.core.cli import main, subcommands, verbindex
from trainroom.core.cli.verbs import VERBS, Verb
from trainroom.core.configuration.sections import JournalPolicy

# What no verb's listing, and no `status`, may import: the control room, the keeper's side and
# what only some verbs use (NVML, the exporter's HTTP server and Prometheus, ssh, TLS, asyncio).
HEAVY = (
    "textual",
    "rich",
    "torch",
    "numpy",
    "pynvml",
    "prometheus_client",
    "ssl",
    "http",
    "urllib.request",
    "asyncio",
    "trainroom.tui",
    "trainroom.core.actions",
    "trainroom.core.keeper",
    "trainroom.core.ops",
    "trainroom.core.health",
    "trainroom.core.ckpt",
    "trainroom.core.notify",
    "trainroom.core.remote.ssh",
    "trainroom.core.probes.gpu",
)
# `--help` reads no run: not the journal, its wire format, or the process table either.
HEAVY_FOR_HELP = (
    *HEAVY,
    "msgspec",
    "psutil",
    "trainroom.core.wire.protocol",
    "trainroom.core.journal",
    "trainroom.core.run.store",
    "trainroom.core.run.state",
    "trainroom.core.run.client",
)

LOADED = r"""
import json, sys
heavy = json.loads(sys.argv[1])
code = 0
if sys.argv[2] == "import":
    import trainroom
else:
    from trainroom.cli import main
    try:
        code = main(sys.argv[2:])
    except SystemExit as exc:  # --help
        code = exc.code
print(json.dumps({"code": code,
                  "heavy": sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))}))
"""


def _loaded(heavy: tuple[str, ...], *argv: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", LOADED, json.dumps(heavy), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRAINROOM_FAKE_NVML": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(out, dict)
    return out


def test_import_trainroom_and_the_cli_module_load_nothing_heavy() -> None:
    assert _loaded(HEAVY_FOR_HELP, "import")["heavy"] == []


def test_help_loads_no_verb() -> None:
    out = _loaded(HEAVY_FOR_HELP, "--help")
    assert out == {"code": 0, "heavy": []}


def test_status_of_a_finished_run_loads_only_what_it_reads(trhome: Path) -> None:
    d, rec = make_run_dir(trhome)
    write_run(d, rec, run_records(200, ranks=2), JournalPolicy(snapshot_records=1000, batch_rows=128))
    for argv in (["status", rec.run_id], ["status", rec.run_id, "--json"], ["status"]):
        assert _loaded(HEAVY, *argv) == {"code": 0, "heavy": []}, argv


def test_the_check_would_see_a_heavy_import() -> None:
    # The same probe on a verb that does use the keeper's actions: it names them.
    out = _loaded(HEAVY, "kill", "--help")
    assert "trainroom.core.actions" in out["heavy"]  # type: ignore[operator]


# ---------------------------------------------------------------------------- the index


def test_the_verb_index_is_current() -> None:
    assert list(verbindex.INDEX) == subcommands.full_index(), (
        "the verb index is stale: run `python scripts/verb_index.py --write`"
    )


def test_every_verb_lives_in_the_cli_or_the_demo() -> None:
    # Named by string, a verb's module is out of the import graph's sight: the layer contracts
    # cannot check it, so this does (the CLI's own package, or the demo below it).
    for verb in VERBS:
        module = verb.where.partition(":")[0]
        assert module.startswith(("trainroom.core.cli.", "trainroom.core.demo.")), verb


def _eager() -> argparse.ArgumentParser:
    """The parser as `trainroom` built it before verbs were lazy: every verb added up front."""
    ap = main.top_parser()
    sub = ap.add_subparsers(dest="cmd")
    for verb in VERBS:
        module, _, function = verb.where.partition(":")
        add = getattr(importlib.import_module(module), function)
        add(sub, main.open_tui) if verb.tui else add(sub)
    return ap


def _subparsers(ap: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))


def test_the_lazy_parser_is_the_eager_one() -> None:
    eager, lazy = _eager(), main.build_parser()
    assert lazy.format_help() == eager.format_help()
    eager_sub, lazy_sub = _subparsers(eager), _subparsers(lazy)
    assert list(lazy_sub.choices) == list(eager_sub.choices)
    for name in eager_sub.choices:
        e, lz = eager_sub.choices[name], lazy_sub.choices[name]
        assert lz.format_help() == e.format_help(), name
        assert lz._defaults.keys() == e._defaults.keys(), name


def test_a_verb_the_index_does_not_know_is_still_offered() -> None:
    # Between adding a verb and regenerating the index: slower, never wrong.
    ap = main.Parser(prog="trainroom")
    sub = ap.add_subparsers(dest="cmd", action=subcommands.LazySubcommands)
    assert isinstance(sub, subcommands.LazySubcommands)
    index = [e for e in verbindex.INDEX if e[0] != "status"]
    sub.offer(VERBS, [*index[:1], ("gone-verb", "a verb removed since", "no.such:verb")], main.open_tui)
    args = ap.parse_args(["status", "r1", "--json"])
    assert (args.cmd, args.run, args.json) == ("status", "r1", True)
    assert "gone-verb" not in sub.choices
    with pytest.raises(SystemExit):
        ap.parse_args(["no-such-verb"])


def test_a_stale_index_entry_is_loaded_from_whichever_verb_adds_it() -> None:
    ap = main.Parser(prog="trainroom")
    sub = ap.add_subparsers(dest="cmd", action=subcommands.LazySubcommands)
    assert isinstance(sub, subcommands.LazySubcommands)
    moved = [
        (n, h, "trainroom.core.cli.verbs:add_status" if n == "runs" else w) for n, h, w in verbindex.INDEX
    ]
    sub.offer(VERBS, moved, main.open_tui)
    assert ap.parse_args(["runs", "--json"]).json is True


def test_a_verb_is_a_module_function_pair() -> None:
    assert Verb("trainroom.core.cli.events:add_parser").where.count(":") == 1
    assert len({v.where for v in VERBS}) == len(VERBS)

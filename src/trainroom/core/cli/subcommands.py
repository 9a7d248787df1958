"""The `trainroom` verbs as argparse subcommands, each loaded when it is used.

`trainroom --help` lists every verb from `verbindex.INDEX` (names and help lines, generated from
`verbs.VERBS`) without importing one; `trainroom VERB ...` imports the one function that adds VERB's
subparser, the moment argparse looks the verb up. The parser behaves as one built eagerly: its
`choices` are every verb, and looking one up (`choices["kill"]`) loads it.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from trainroom.core.cli.verbs import VERBS, OpenTui, Verb

# A verb that `--help` lists and that is not loaded yet.
LISTED: Any = object()

IndexEntry = tuple[str, "str | None", str]  # (verb name, its help line, the VERBS entry that adds it)


class Parsers(dict[str, Any]):
    """The subcommands' parsers by name; a listed verb is loaded on its first lookup."""

    def __init__(self, owner: LazySubcommands) -> None:
        super().__init__()
        self._owner = owner

    def __getitem__(self, name: str) -> Any:
        if super().__getitem__(name) is LISTED:
            self._owner.load(name)
        value = super().__getitem__(name)
        if value is LISTED:
            raise KeyError(name)
        return value

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def values(self) -> Any:
        self._owner.load_all()
        return super().values()

    def items(self) -> Any:
        self._owner.load_all()
        return super().items()


if TYPE_CHECKING:  # generic only to the type checker
    _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    _Subcommands = argparse._SubParsersAction


class LazySubcommands(_Subcommands):
    """`add_subparsers(action=LazySubcommands)`, then `.offer(VERBS, INDEX, open_tui)`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._name_parser_map = self.choices = Parsers(self)
        self._verbs: dict[str, Verb] = {}
        self._where: dict[str, str] = {}  # a listed verb's name -> the VERBS entry that adds it
        self._loaded: set[str] = set()
        self._open_tui: OpenTui | None = None

    def offer(self, verbs: Sequence[Verb], index: Iterable[IndexEntry], open_tui: OpenTui) -> None:
        self._open_tui = open_tui
        self._verbs = {v.where: v for v in verbs}
        for name, help_line, where in index:
            if where not in self._verbs:
                continue  # a stale index: that verb is gone
            if help_line is not None:
                self._choices_actions.append(self._ChoicesPseudoAction(name, (), help_line))
            dict.__setitem__(self._name_parser_map, name, LISTED)
            self._where[name] = where
        # A verb the index does not know yet (the index is stale: a test says so) is loaded now.
        for verb in verbs:
            if verb.where not in self._where.values():
                self._load_verb(verb)

    def load(self, name: str) -> None:
        where = self._where.get(name)
        if where is not None:
            self._load_verb(self._verbs[where])
        if dict.get(self._name_parser_map, name) is LISTED:
            self.load_all()  # the index named the wrong function: whichever adds it
        if dict.get(self._name_parser_map, name) is LISTED:
            dict.__delitem__(self._name_parser_map, name)

    def load_all(self) -> None:
        for verb in self._verbs.values():
            self._load_verb(verb)

    def _load_verb(self, verb: Verb) -> None:
        if verb.where in self._loaded:
            return
        self._loaded.add(verb.where)
        module, _, function = verb.where.partition(":")
        add = getattr(importlib.import_module(module), function)
        if verb.tui:
            add(self, self._open_tui)
        else:
            add(self)

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if dict.get(self._name_parser_map, name) is not LISTED:
            return super().add_parser(name, **kwargs)
        kwargs.pop("help", None)  # listed already, with the index's help line
        aliases = kwargs.pop("aliases", ())
        if kwargs.get("prog") is None:
            kwargs["prog"] = f"{self._prog_prefix} {name}"
        parser: argparse.ArgumentParser = self._parser_class(**kwargs)
        for each in (name, *aliases):
            dict.__setitem__(self._name_parser_map, each, parser)
        return parser


def full_index(verbs: Sequence[Verb] = VERBS) -> list[IndexEntry]:
    """Every verb each VERBS entry adds, in order, with its help line: what `verbindex.INDEX` holds
    (read by loading every verb, as `trainroom` did before verbs were lazy)."""
    ap = argparse.ArgumentParser(prog="trainroom")
    sub = ap.add_subparsers(dest="cmd")
    out: list[IndexEntry] = []
    for verb in verbs:
        before = set(sub._name_parser_map)
        listed = len(sub._choices_actions)
        module, _, function = verb.where.partition(":")
        add = getattr(importlib.import_module(module), function)
        if verb.tui:
            add(sub, lambda _args: 0)
        else:
            add(sub)
        helps = {c.dest: c.help for c in sub._choices_actions[listed:]}
        out += [(name, helps.get(name), verb.where) for name in sub._name_parser_map if name not in before]
    return out


def render_index(entries: Iterable[IndexEntry]) -> str:
    """verbindex.py's text (ruff-formatted as written)."""
    lines = [
        '"""Generated by `python scripts/verb_index.py --write` from `verbs.VERBS`: each verb, its line in',
        "`trainroom --help`, and the VERBS entry that adds it (read without importing any verb). Do not",
        'edit: tests/unit/test_cli_lazy.py fails when this is stale."""',
        "",
        "INDEX: tuple[tuple[str, str | None, str], ...] = (",
    ]
    lines += [f"    ({name!r}, {help_line!r}, {where!r})," for name, help_line, where in entries]
    lines.append(")")
    return "\n".join(lines) + "\n"

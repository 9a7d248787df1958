"""An action's arguments, declared once on its `Args` struct, for every client: each field's
`Annotated[..., arg(...)]` says its help, its CLI flag (`--grace` for `grace_s`; by default the
field's name, `--start-ticks`), how a typed word becomes its value, and whether it is required.

The CLI's options are made of these (`add_options`), the control room's prompt for an argument a
key does not have asks for these (`missing`, `parse`), and both check a value the way the keeper
does: the word through the field's parser, then the whole `Args` through msgspec and the action's
`validate`."""

from __future__ import annotations

import argparse
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec


@dataclass(frozen=True)
class Arg:
    """What a client needs of one argument beyond its type."""

    help: str
    flag: str | None = None  # the CLI's spelling (default: `--` and the field's name, dashed)
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # a typed word -> the value (ArgumentTypeError: why not)
    required: bool = False  # the CLI requires it, the control room's key asks for it
    cli: bool = True  # False: a client fills it (the processes table's start tick), no CLI flag


def arg(
    help: str,
    *,
    flag: str | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    required: bool = False,
    cli: bool = True,
) -> Arg:
    return Arg(help, flag, metavar, parse, required, cli)


@dataclass(frozen=True)
class Option:
    """One field of an action's `Args`, as the CLI and the control room's prompt use it."""

    name: str  # the field's name: the request's key, the argparse `dest`
    arg: Arg
    base: type  # int, float, str or bool (what the word is read as, without a parser of its own)
    default: Any

    @property
    def flag(self) -> str:
        return self.arg.flag or "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """A typed word as this argument's value; ArgumentTypeError says why not, in one line."""
        if self.arg.parse is not None:
            return self.arg.parse(text)
        if self.base is bool:
            word = text.strip().lower()
            if word in ("y", "yes", "true", "1", "on"):
                return True
            if word in ("n", "no", "false", "0", "off"):
                return False
            raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")
        if self.base is int:
            try:
                return int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if self.base is float:
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
            if not math.isfinite(value):
                raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
            return value
        if not text.strip():
            raise argparse.ArgumentTypeError("expected a value, got nothing")
        return text


def _base(tp: Any) -> type:
    """`float | None` -> float: what a word is read as."""
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next((a for a in typing.get_args(tp) if a is not type(None)), str)
        return _base(tp)
    return tp if tp in (int, float, str, bool) else str


def options(args: type[msgspec.Struct]) -> list[Option]:
    """The fields of `args` that a client can give, in declaration order."""
    hints = typing.get_type_hints(args, include_extras=True)
    out = []
    for f in msgspec.structs.fields(args):
        hint = hints[f.name]
        extras = typing.get_args(hint)[1:] if typing.get_origin(hint) is typing.Annotated else ()
        meta = next((m for m in extras if isinstance(m, Arg)), None)
        if meta is None:
            continue
        default = None if f.default is msgspec.NODEFAULT else f.default
        out.append(Option(f.name, meta, _base(hint), default))
    return out


def add_options(ap: argparse.ArgumentParser, args: type[msgspec.Struct]) -> None:
    """The CLI verb's options beyond `RUN --yes --json`, one per field of `args` (its `dest`)."""
    for o in options(args):
        if not o.arg.cli:
            continue
        if o.base is bool and o.arg.parse is None:
            ap.add_argument(o.flag, dest=o.name, action="store_true", help=o.arg.help)
            continue
        ap.add_argument(
            o.flag,
            dest=o.name,
            type=o.parse,
            default=o.default,
            metavar=o.arg.metavar,
            required=o.arg.required,
            help=o.arg.help,
        )


def given(args: type[msgspec.Struct], values: Mapping[str, Any] | argparse.Namespace) -> dict[str, Any]:
    """The request's arguments: the fields of `args` that `values` gives (not None)."""
    get = values.get if isinstance(values, Mapping) else lambda k: getattr(values, k, None)
    return {f.name: v for f in msgspec.structs.fields(args) if (v := get(f.name)) is not None}


def missing(args: type[msgspec.Struct], values: Mapping[str, Any]) -> list[Option]:
    """The required arguments `values` lacks: what the control room's key asks for."""
    return [o for o in options(args) if o.arg.required and values.get(o.name) is None]

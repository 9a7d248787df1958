"""An exception as the wire carries it: its chain of causes, outermost first, each link's type,
message and errno; a DataLoader worker's wrapped exception split so its own error comes last
(what a death names first). Re-exported by `protocol`, whose Crash carries it."""

from __future__ import annotations

import errno as errno_mod
from typing import Annotated

import msgspec

from trainroom.core.logs.loglines import worker_original

Name = Annotated[str, msgspec.Meta(max_length=256)]
Text = Annotated[str, msgspec.Meta(max_length=16384)]


class ErrorLink(msgspec.Struct, kw_only=True, omit_defaults=True):
    type: Text
    message: Text
    errno: int | None = None
    errno_name: Name | None = None


def error_chain(exc: BaseException) -> list[ErrorLink]:
    """The exception and what it was raised from, outermost first, innermost last."""
    links: list[ErrorLink] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        no = getattr(cur, "errno", None)
        no = no if isinstance(no, int) else None
        links.append(
            ErrorLink(
                type=type(cur).__qualname__
                if type(cur).__module__ == "builtins"
                else f"{type(cur).__module__}.{type(cur).__qualname__}",
                message=str(cur),
                errno=no,
                errno_name=errno_mod.errorcode.get(no) if no is not None else None,
            )
        )
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return unwrap_workers(links)


def unwrap_workers(links: list[ErrorLink]) -> list[ErrorLink]:
    """A DataLoader worker's exception wrapped by torch (its traceback inside the message) split
    in two: the wrapper's first line, then the worker's own exception as the link after it (the
    innermost: what a death names first)."""
    out: list[ErrorLink] = []
    for link in links:
        found = worker_original(link.message)
        if found is None:
            out.append(link)
            continue
        first, kind, message = found
        where = first.split(" in ", 1)[1].rstrip(".") if " in " in first else ""
        out += [ErrorLink(type=link.type, message=first, errno=link.errno, errno_name=link.errno_name)]
        out += [ErrorLink(type=kind, message=f"{message} (in {where})" if where else message)]
    return out

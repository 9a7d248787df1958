"""Salvaging an inbound frame that failed validation: decode it again without the fields that
broke their type or bound, so one bad value (`lr=-1`, `tokens=-1`, a string for a number) costs
that value, not the frame, the connection and with them all of a run's telemetry."""

from __future__ import annotations

import re
from typing import Any

import msgspec


class NotAMessage(Exception):
    """The body is not a message at all (not msgpack, no known tag): a peer speaking something
    else, which ends its connection."""


class RefusedField(msgspec.Struct, kw_only=True, frozen=True):
    """One field of an inbound frame that broke its type or bound: `field` is the message's tag
    and the field's path (`hello.config.lr`, `step.tokens`), `value` a short repr of what came.
    `whole_frame`: the field could not be left out (a required one), so the frame was dropped."""

    field: str
    value: str
    reason: str
    whole_frame: bool = False


_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")
SALVAGE_TRIES = 8


def _error_path(message: str) -> list[str | int] | None:
    """The path msgspec names in a validation error (`... - at `$.config.lr``), as keys and list
    indices; None when it names none (a missing required field, a wrong type at the top)."""
    at = message.rfind(" - at `$")
    if at < 0 or not message.endswith("`"):
        return None
    parts: list[str | int] = []
    for m in _PATH_PART.finditer(message[at + 7 : -1]):
        if m.group(1) is not None:
            parts.append(m.group(1))
        elif m.group(2) is not None and m.group(2) != "...":
            parts.append(int(m.group(2)))
        else:
            parts.append("...")  # a dict value: no key to follow
    return parts


def _leave_out(obj: Any, path: list[str | int]) -> tuple[str, Any] | None:
    """Delete the deepest named field on `path` from `obj` (a list item or a dict value goes with
    the field that holds it); (its dotted name, the value taken out), or None when it cannot."""
    names = [i for i, part in enumerate(path) if isinstance(part, str) and part != "..."]
    if not names or (len(names) == 1 and path[0] == "type"):
        return None
    last = names[-1]
    parent: Any = obj
    for part in path[:last]:
        in_dict = isinstance(parent, dict) and isinstance(part, str) and part in parent
        in_list = isinstance(parent, list) and isinstance(part, int) and part < len(parent)
        if not (in_dict or in_list):
            return None
        parent = parent[part]
    key = path[last]
    if not isinstance(parent, dict) or key not in parent:
        return None
    value = parent.pop(key)
    dotted = "".join(f".{q}" if isinstance(q, str) else f"[{q}]" for q in path[: last + 1])
    return dotted.lstrip("."), value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def salvage(body: bytes, target: Any) -> tuple[Any | None, list[RefusedField]]:
    """Decode a frame that failed validation again without the fields that broke it: the
    message without them (None when a required field is among them) and what was left out.
    Raises NotAMessage when the body is not a message of `target` at all (not msgpack, no
    known tag): that is not a bad value but a peer speaking something else."""
    try:
        obj = msgspec.msgpack.decode(body)
    except msgspec.DecodeError as exc:
        raise NotAMessage(f"undecodable frame: {exc}") from None
    tag = obj.get("type") if isinstance(obj, dict) else None
    if not isinstance(tag, str):
        raise NotAMessage("undecodable frame: not a tagged message")
    refused: list[RefusedField] = []
    for _ in range(SALVAGE_TRIES):
        try:
            return msgspec.convert(obj, target), refused
        except msgspec.ValidationError as exc:
            message = str(exc)
            path = _error_path(message)
            if path is not None and path[:1] == ["type"]:
                raise NotAMessage(f"undecodable frame: {message}") from None
            taken = _leave_out(obj, path) if path is not None else None
            if taken is None:
                # A required field: the one just left out (so say it), or one that never came.
                last = refused.pop() if refused else RefusedField(field=tag, value="", reason=message)
                refused.append(msgspec.structs.replace(last, whole_frame=True))
                return None, refused
            refused.append(
                RefusedField(
                    field=f"{tag}.{taken[0]}", value=_short(taken[1]), reason=message.split(" - at ")[0]
                )
            )
    refused.append(RefusedField(field=tag, value="", reason="too many bad fields", whole_frame=True))
    return None, refused

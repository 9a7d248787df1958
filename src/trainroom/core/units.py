"""How trainroom writes figures, once: bytes, durations, clocks, signal and errno names, alert
targets with their secrets left out, and JSON for scripts (`to_json`, every `--json` output).

Every message a rule writes, every line `status` prints and every panel of the control room
formats through these, so one figure reads the same everywhere, whoever prints it.
Binary units throughout, as nvidia-smi, free and df -h show them. An unknown value is
`unknown` (an em dash by default), never an invented zero.
"""

from __future__ import annotations

import errno as errno_mod
import hashlib
import json
import math
import os
import shlex
import signal
import time
from typing import Any
from urllib.parse import urlsplit

import msgspec

UNKNOWN = "—"
KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
_BYTE_UNITS = (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB))


def fmt_bytes(n: float | None, unknown: str = UNKNOWN, digits: int = 1) -> str:
    """1.5 GiB, 400 MiB, 12.3 KiB, 512 B: `digits` decimals under 100 of a unit, none above (two
    where a before -> after figure must show a small change)."""
    if n is None or not math.isfinite(n):
        return unknown
    x = float(n)
    for unit, size in _BYTE_UNITS:
        if abs(x) >= size:
            value = x / size
            return f"{value:.{digits}f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"
    return f"{x:.0f} B"


def fmt_duration(s: float | None, unknown: str = UNKNOWN) -> str:
    """0.4 s, 12 s, 3m07s, 2h05m, 3d04h."""
    if s is None or not math.isfinite(s):
        return unknown
    s = max(s, 0.0)
    if s < 60:
        return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def fmt_clock(t: float | None, unknown: str = UNKNOWN) -> str:
    """A wall-clock time to the hundredth of a second, local: 2026-12-03 09:41:07.25."""
    if t is None or not math.isfinite(t):
        return unknown
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 100):02d}"


def signal_name(n: int) -> str:
    """SIGKILL for 9; `signal 77` for a number with no name here."""
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def errno_name(number: int | None, name: str | None = None) -> str | None:
    """ENOMEM for 12 (or the name the trainer already sent); None when neither is known."""
    if name:
        return name
    if number is not None:
        return errno_mod.errorcode.get(number)
    return None


def _tag(secret: str) -> str:
    """Four hex digits that tell two redacted targets apart without giving either away."""
    return hashlib.sha256(secret.encode()).hexdigest()[:4]


def redact_url(url: str) -> str:
    """An alert URL as it may be shown: scheme, host and port only (a Slack webhook's path, an
    ntfy topic, a token in the query or user part are secrets), tagged so two stay apart:
    `https://hooks.slack.com/…#1a2b`."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return f"<url>#{_tag(url)}"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}/…#{_tag(url)}"


def redact_command(command: str) -> str:
    """An alert command as it may be shown: the program's name only (its arguments may carry a
    token), tagged: `notify.sh …#1a2b`."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    name = os.path.basename(words[0]) if words else "?"
    return f"{name} …#{_tag(command)}"


# --------------------------------------------------------------------------- JSON for scripts

# Keys whose non-finite value is worth keeping as text next to the null (`loss_raw: "nan"`).
RAW_KEYS = frozenset({"loss"})


def to_json(obj: object, *, indent: int | None = 2) -> str:
    """Strict JSON, whatever the figures: every `--json` output is written here. A non-finite
    float (a NaN loss, an unmeasured ratio) is `null`, never the `NaN` / `Infinity` tokens that
    json.dumps writes and no JSON parser reads; where the value itself matters (the loss) it is
    kept as a string beside (`loss_raw`). Structs, dataclasses and tuples become plain JSON;
    anything else unknown is its str(). `indent=None`: one compact line (an event stream)."""
    plain = msgspec.to_builtins(obj, str_keys=True, enc_hook=str)
    separators = (",", ":") if indent is None else None
    return json.dumps(json_safe(plain), indent=indent, separators=separators, allow_nan=False)


def json_safe(obj: Any) -> Any:
    """`obj` (plain dicts, lists, scalars) with every non-finite float made null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if k in RAW_KEYS and isinstance(v, (float, str)) and not _finite(v):
                out[f"{k}_raw"] = v if isinstance(v, str) else _word(v)
                out[k] = None
            else:
                out[str(k)] = json_safe(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _finite(v: float | str) -> bool:
    if isinstance(v, str):
        return v not in ("nan", "inf", "-inf")
    return math.isfinite(v)


def _word(v: float) -> str:
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")

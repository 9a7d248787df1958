"""Every `--json` output is strict JSON through one encoder (`units.to_json`): a non-finite figure
is null (the loss keeps its word beside, `loss_raw`), never a `NaN` / `Infinity` token that
json.dumps writes and no JSON parser reads."""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from trainroom.core.cli import doctor as doctor_cli
from trainroom.core.cli import notify as notify_cli
from trainroom.core.cli.output import to_json as cli_to_json
from trainroom.core.configuration.sections import Notify
from trainroom.core.run.events import Event
from trainroom.core.run.events import to_json as event_json
from trainroom.core.units import to_json

NAN, INF = float("nan"), float("inf")
SRC = Path(__file__).resolve().parents[2] / "src" / "trainroom"


def strict(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"non-strict JSON token {token!r} in {text[:200]!r}")

    return json.loads(text, parse_constant=refuse)


class Figures(msgspec.Struct):
    ratio: float
    loss: float
    series: list[float]


@dataclass
class Row:
    tflops: float


def test_the_encoder_writes_no_non_finite_token_anywhere() -> None:
    obj = {
        "a": NAN,
        "b": [INF, -INF, 1.5],
        "c": {"d": (NAN, 2)},
        "s": Figures(ratio=INF, loss=NAN, series=[NAN, 0.5]),
        "row": Row(tflops=-INF),
        7: Path("/x"),
    }
    for indent in (2, None):
        text = to_json(obj, indent=indent)
        d = strict(text)
        assert "NaN" not in text and "Infinity" not in text
        assert d["a"] is None and d["b"] == [None, None, 1.5] and d["c"] == {"d": [None, 2]}
        assert d["s"] == {"ratio": None, "loss": None, "loss_raw": "nan", "series": [None, 0.5]}
        assert d["row"] == {"tflops": None} and d["7"] == "/x"


def test_finite_figures_pass_unchanged() -> None:
    assert strict(to_json({"x": 1e308, "y": -0.0, "z": 3})) == {"x": 1e308, "y": -0.0, "z": 3}


def test_the_cli_encoder_is_the_one_encoder() -> None:
    assert cli_to_json is to_json


def test_an_event_line_with_non_finite_evidence_is_strict() -> None:
    e = Event(t=1.0, run="r", event="finding", code="LOSS_SPIKE", evidence={"ratio": NAN, "loss": INF})
    line = event_json(e)
    assert "\n" not in line
    d = strict(line)
    assert d["evidence"] == {"ratio": None, "loss": None, "loss_raw": "inf"}


def test_doctor_json_is_strict(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Report:
        ok = True

        def as_dict(self) -> dict[str, Any]:
            return {"ok": True, "gpu": {"tflops": NAN, "free": INF}}

    monkeypatch.setattr(doctor_cli, "run_doctor", lambda _options: Report())
    args = argparse.Namespace(gpu="auto", project=None, python=None, ckpt_root=None, json=True)
    assert doctor_cli.cmd_doctor(args) == 0
    assert strict(capsys.readouterr().out)["gpu"] == {"tflops": None, "free": None}


def test_notify_json_is_strict(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(
        notify_cli,
        "_target",
        lambda _spec, _named=None: notify_cli.Source(info=None, policy=Notify(), where="here", cwd="/"),
    )
    monkeypatch.setattr(notify_cli, "channels_from", lambda *_a, **_k: ([], [("hook", "no command")]))
    result = {"channel": "hook", "outcome": "delivered", "detail": "", "latency_s": NAN}
    monkeypatch.setattr(notify_cli, "_from_here", lambda *_a: [result])
    assert notify_cli.cmd_notify(argparse.Namespace(run=None, test=True, json=True)) == 0
    d = strict(capsys.readouterr().out)
    assert d["ok"] is True and d["results"][0]["latency_s"] is None


def _writers(tree: ast.AST) -> list[str]:
    """Calls that write JSON text themselves: json.dumps, msgspec.json.encode, an Encoder."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("json.dumps", "msgspec.json.encode") or name.endswith("json.Encoder"):
                found.append(f"line {node.lineno}: {name}")
    return found


def test_no_command_writes_json_but_through_the_one_encoder() -> None:
    """Every module behind a `--json` flag prints through `to_json`, nothing of its own."""
    offenders = {}
    for path in [*sorted((SRC / "core" / "cli").glob("*.py")), SRC / "core" / "run" / "events.py"]:
        found = _writers(ast.parse(path.read_text()))
        if found:
            offenders[str(path.relative_to(SRC))] = found
    assert offenders == {}


def test_the_guard_against_other_writers_can_fail() -> None:
    assert _writers(ast.parse("import json\nprint(json.dumps({'a': float('nan')}))")) == [
        "line 2: json.dumps"
    ]

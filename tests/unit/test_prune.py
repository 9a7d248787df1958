"""Prune on a real checkpoint root made by real saves: what it keeps, what it never touches."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.ckpt_fixtures import small_state
from trainroom.core.ckpt import layout as ck
from trainroom.core.ckpt.report import failure_report
from trainroom.core.cli import ckpt as cli
from trainroom.core.health import diskguard as dg
from trainroom.core.ops import prune as pr
from trainroom.core.sdk import save as save


def make_root(root: Path, steps: list[int], width: int = 64) -> list[save.Saved]:
    return [save.save_checkpoint(small_state(s, width), s, root=root) for s in steps]


def step_dirs(root: Path) -> list[str]:
    return sorted(x.name for x in root.iterdir() if x.name.startswith("step-"))


def test_keeps_the_last_n_verified_and_latest(tmp_path: Path) -> None:
    make_root(tmp_path, [100, 200, 300, 400, 500])
    sizes = {x.name: ck.tree_bytes(x) for x in tmp_path.iterdir() if x.name.startswith("step-")}
    dry = pr.prune(tmp_path, keep=2, dry_run=True)
    assert [Path(t.path).name for t in dry.deleted] == ["step-000300", "step-000200", "step-000100"]
    assert dry.bytes_freed == sizes["step-000100"] + sizes["step-000200"] + sizes["step-000300"]
    assert len(step_dirs(tmp_path)) == 5  # a dry run deletes nothing
    res = pr.prune(tmp_path, keep=2)
    assert res.bytes_freed == dry.bytes_freed and not res.failed
    assert step_dirs(tmp_path) == ["step-000400", "step-000500"]
    assert {Path(k.path).name: k.why for k in res.kept} == {
        "step-000500": "latest",
        "step-000400": "one of the last 2 verified",
    }
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step-000500" / "step-000500.pt"


def test_pinned_latest_and_in_use_are_kept(tmp_path: Path) -> None:
    make_root(tmp_path, [1, 2, 3, 4, 5, 6])
    ck.pin(tmp_path / "step-000001")
    ck.replace_latest(tmp_path, "step-000002")  # a resume rolled latest back to step 2
    resume_file = tmp_path / "step-000003" / "step-000003.pt"
    res = pr.prune(tmp_path, keep=1, protect=[resume_file])
    assert step_dirs(tmp_path) == ["step-000001", "step-000002", "step-000003", "step-000006"]
    why = {Path(k.path).name: k.why for k in res.kept}
    assert why == {
        "step-000001": "pinned",
        "step-000002": "latest",
        "step-000003": "in use (resume or verification)",
        "step-000006": "one of the last 1 verified",
    }


def test_symlink_outside_the_root_is_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "ck", tmp_path / "precious"
    make_root(root, [1, 2, 3, 4])
    # A copy of a real step dir outside the root, linked in under a step name, and a link inside a
    # step dir that will be deleted: neither target may be touched.
    outside.mkdir()
    (outside / "manifest.json").write_text((root / "step-000001" / "manifest.json").read_text())
    (outside / "step-000001.pt").write_bytes((root / "step-000001" / "step-000001.pt").read_bytes())
    (outside / "keep-me.bin").write_bytes(b"x" * 5000)
    os.symlink(outside, root / "step-000000")
    os.symlink(outside / "keep-me.bin", root / "step-000001" / "link.bin")
    before = sorted(p.name for p in outside.iterdir())
    plan = pr.plan(root, keep=1)
    assert "step-000000" not in [Path(t.path).name for t in plan.delete]
    assert any(Path(s.path).name == "step-000000" and "never followed" in s.why for s in plan.skipped)
    res = pr.execute(plan)
    assert (
        sorted(p.name for p in outside.iterdir()) == before
        and (outside / "keep-me.bin").stat().st_size == 5000
    )
    assert (root / "step-000000").is_symlink()
    assert step_dirs(root) == ["step-000000", "step-000004"]
    # The link's own few bytes were counted, never its target's 5000.
    freed = {Path(t.path).name: t.bytes for t in res.deleted}
    link_len = len(str(outside / "keep-me.bin"))
    assert abs(freed["step-000001"] - freed["step-000002"] - link_len) < 100, freed


def test_latest_pointing_outside_is_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "ck", tmp_path / "elsewhere"
    make_root(root, [1, 2, 3])
    outside.mkdir()
    (root / "latest").unlink()
    os.symlink(outside, root / "latest")
    res = pr.prune(root, keep=1)
    assert outside.is_dir() and (root / "latest").is_symlink()
    assert any("not followed" in s.why for s in res.skipped)
    assert step_dirs(root) == ["step-000003"]


def test_quarantine_and_unverified_dirs_are_left_alone(tmp_path: Path) -> None:
    make_root(tmp_path, [1, 2, 3])
    pending = save.save_checkpoint(small_state(4), 4, root=tmp_path, promote_inline=False)  # being verified
    bad = save.save_checkpoint(small_state(5), 5, root=tmp_path, promote_inline=False)
    ck.Quarantine(tmp_path).reject(Path(bad.path), failure_report(bad.path, "truncated: test"))
    (tmp_path / "step-000009").mkdir()  # someone's own directory, no manifest
    (tmp_path / "step-000009" / "notes.txt").write_text("mine")
    res = pr.prune(tmp_path, keep=1)
    assert step_dirs(tmp_path) == ["step-000003", "step-000009"]
    assert Path(pending.path).exists() and Path(bad.path).exists()
    assert any(Path(s.path).name == "step-000009" for s in res.skipped)
    res = pr.prune(tmp_path, keep=1, include_rejected=True)
    assert not Path(bad.path).exists() and not Path(bad.path + ".reason").exists()
    assert Path(pending.path).exists()
    assert [t.kind for t in res.deleted] == ["rejected"]


def test_disk_fill_then_prune_keeps_n(tmp_path: Path) -> None:
    """Scenario 11: a checkpoint every step fills the disk; the guard warns with a projection, and
    prune brings it back under the threshold keeping the last two. The statvfs figures are those
    of a 2 MB disk whose use is what the root really holds on disk."""
    root = tmp_path / "ck"
    saved = make_root(root, list(range(1, 9)), width=4096)
    disk = 2_000_000
    base_used = 100_000

    def statvfs(_path: str) -> SimpleNamespace:
        used = base_used + ck.tree_bytes(root)
        return SimpleNamespace(
            f_frsize=1, f_bsize=1, f_blocks=disk, f_bfree=disk - used, f_bavail=disk - used
        )

    u = dg.disk_usage(root, statvfs)
    assert u.used_fraction >= 0.85, u
    manifests = [json.loads((Path(s.promoted) / "manifest.json").read_text()) for s in saved]
    # One save a minute, at the sizes the manifests recorded.
    saves = [(60.0 * i, m["size_bytes"]) for i, m in enumerate(manifests)]
    now = saves[-1][0] + 1
    prunable = pr.plan(root, keep=2).bytes_to_free
    found = {f.code: f for f in dg.disk_findings(u, None, saves, now, prunable_bytes=prunable)}
    assert found["DISK_HIGH"].severity in ("warning", "critical")
    assert found["DISK_FULL_SOON"].evidence["saves_left"] <= 2
    assert found["DISK_FULL_SOON"].evidence["cadence_s"] == 60.0
    res = pr.prune(root, keep=2)
    assert res.bytes_freed == prunable and len(res.deleted) == 6
    assert step_dirs(root) == ["step-000007", "step-000008"]
    after = dg.disk_usage(root, statvfs)
    assert after.used_bytes == u.used_bytes - res.bytes_freed
    assert dg.disk_high(after) is None


def _cli(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="trainroom")
    cli.add_parser(ap.add_subparsers())
    return ap.parse_args(argv)


def test_cli(
    trhome: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_root(tmp_path, [1, 2, 3])
    assert cli.run_prune(_cli(["prune", "--root", str(tmp_path), "--keep", "1", "--dry-run", "--json"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] and len(out["deleted"]) == 2 and out["bytes_freed"] > 0 and out["via"] == "files"
    assert step_dirs(tmp_path) == ["step-000001", "step-000002", "step-000003"]
    # Destructive: with no terminal to ask on, it needs --yes (a clear one-liner, exit 2).
    assert cli.run_prune(_cli(["prune", "--root", str(tmp_path), "--keep", "1"])) == 2
    assert "pass --yes" in capsys.readouterr().err and len(step_dirs(tmp_path)) == 3
    assert cli.run_prune(_cli(["prune", "--root", str(tmp_path), "--keep", "1", "--yes"])) == 0
    text = capsys.readouterr().out
    assert "deleted  " in text and "freed" in text and step_dirs(tmp_path) == ["step-000003"]
    assert text.splitlines()[0].startswith("freed ")  # the summary before the path lines
    assert cli.run_prune(_cli(["prune", "--root", str(tmp_path / "nope")])) == 2
    assert "not a directory" in capsys.readouterr().err
    assert cli.run_prune(_cli(["prune", "--root", str(tmp_path), "--keep", "-1"])) == 2
    assert cli.run_prune(_cli(["prune", "run-x", "--root", str(tmp_path)])) == 2
    assert "not both" in capsys.readouterr().err
    # No RUN, no --root, no $TRAINROOM_CKPT_ROOT and no runs at all: says what to give.
    monkeypatch.delenv(ck.ENV_ROOT, raising=False)
    assert cli.run_prune(_cli(["prune"])) == 2
    assert "TRAINROOM_CKPT_ROOT" in capsys.readouterr().err
    monkeypatch.setenv(ck.ENV_ROOT, str(tmp_path))
    # Nothing left to delete: said as the answer (exit 1, nothing to do), never a yes/no.
    assert cli.run_prune(_cli(["prune", "--json", "--yes"])) == 1
    said = json.loads(capsys.readouterr().out)
    assert said["root"] == str(tmp_path) and said["message"].startswith("nothing to delete under ")
    assert cli.run_prune(_cli(["prune"])) == 1  # no --yes, no terminal: no question asked either
    assert "pass --yes" not in capsys.readouterr().err


def test_cli_resolves_the_run_root(trhome: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainroom.core.run import store as runs

    root = tmp_path / "ck"
    make_root(root, [1, 2, 3, 4])
    _, rec = runs.create_run(["python", "train.py"], str(tmp_path), {"ckpt_root": str(root), "keep": 3})
    assert cli.run_prune(_cli(["prune", rec.run_id, "--json", "--yes"])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["root"] == str(root) and out["keep"] == 3 and len(out["deleted"]) == 1
    assert cli.run_prune(_cli(["prune", "no-such-run"])) == 2
    assert "unknown run" in capsys.readouterr().err


def test_a_plan_confirmed_before_more_saves_deletes_only_what_was_confirmed(tmp_path: Path) -> None:
    make_root(tmp_path, [100, 200, 300, 400])
    shown = pr.plan(tmp_path, keep=2)
    assert [t.step for t in shown.delete] == [200, 100]
    # The run saves twice more while the plan is read, and step 100 is pinned meanwhile.
    make_root(tmp_path, [500, 600])
    ck.pin(tmp_path / "step-000100")
    part = pr.confirmed_part(pr.plan(tmp_path, keep=2), {t.path: t.step for t in shown.delete})
    assert [t.step for t in part.plan.delete] == [200]
    assert [t.step for t in part.arrived] == [400, 300]
    assert [(k.step, k.why) for k in part.no_longer] == [(100, "pinned")]
    res = pr.execute(part.plan)
    assert [t.step for t in res.deleted] == [200]
    assert step_dirs(tmp_path) == ["step-000100", "step-000300", "step-000400", "step-000500", "step-000600"]
    assert {k.step for k in res.kept if k.why == pr.ARRIVED} == {300, 400}

"""Disk guard rules over statvfs figures and /proc/mounts text (both injected), and the real
readings of this machine's own filesystem."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainroom.core.health import diskguard as dg

GB = 4096 * 244_141  # ~1 GB in whole 4 KiB blocks, so figures round-trip exactly


def statvfs_of(total: int, avail: int, frsize: int = 4096) -> dg.StatvfsFn:
    """statvfs figures for a disk of `total` bytes with `avail` available (no root reserve)."""
    return lambda _path: SimpleNamespace(
        f_frsize=frsize,
        f_bsize=frsize,
        f_blocks=total // frsize,
        f_bfree=avail // frsize,
        f_bavail=avail // frsize,
    )


def usage(total: int, avail: int, path: str = "/ck") -> dg.DiskUsage:
    return dg.disk_usage(path, statvfs_of(total, avail))


def test_real_statvfs_reading(tmp_path: Path) -> None:
    u = dg.disk_usage(tmp_path)
    st = os.statvfs(tmp_path)
    assert u.total_bytes == st.f_blocks * st.f_frsize and u.free_bytes == st.f_bavail * st.f_frsize
    assert 0.0 < u.used_fraction < 1.0
    # A root that does not exist yet is measured on its nearest existing ancestor.
    assert dg.disk_usage(tmp_path / "not" / "yet").total_bytes == u.total_bytes
    obs = dg.observe(tmp_path)
    assert obs.fstype and obs.mountpoint and (obs.free_bytes or 0) > 0


def test_used_fraction_counts_root_reserve_like_df() -> None:
    fn = lambda _p: SimpleNamespace(f_frsize=1, f_bsize=1, f_blocks=100, f_bfree=10, f_bavail=5)  # noqa: E731
    u = dg.disk_usage("/x", fn)
    assert u.used_bytes == 90 and u.free_bytes == 5
    assert u.used_fraction == pytest.approx(90 / 95)


@pytest.mark.parametrize(
    ("avail_pct", "severity"), [(16, None), (14, "warning"), (6.5, "warning"), (5.5, "critical")]
)
def test_disk_high_thresholds(avail_pct: float, severity: str | None) -> None:
    f = dg.disk_high(usage(100 * GB, int(avail_pct * GB)))
    if severity is None:
        assert f is None
    else:
        assert f is not None and f.code == "DISK_HIGH" and f.severity == severity and f.action == "prune"
        assert f"{100 - avail_pct:.1f}% used" in f.message


def test_disk_full_soon_from_size_and_cadence() -> None:
    # Scenario 11: 3.9 GB checkpoints; here one every 20 min with 20 GB available.
    saves = [(1000.0 + 1200 * i, int(3.9 * GB)) for i in range(5)]
    u = usage(500 * GB, 20 * GB)
    now = saves[-1][0] + 60
    proj = dg.project(u, saves, now)
    assert proj is not None and proj.cadence_s == 1200 and proj.checkpoint_bytes == int(3.9 * GB)
    assert proj.saves_left == 5  # 20 GB - 256 MiB reserve holds five more
    assert proj.time_to_full_s == pytest.approx(6 * 1200 - 60)
    f = dg.disk_full_soon(u, saves, now)
    assert f is not None and f.code == "DISK_FULL_SOON" and f.severity == "warning"
    # Figures as core/units writes them: 3.9 GB is 3.6 GiB, 1 h 59 min is 1h59m.
    assert "5 more fit; full in 1h59m" in f.message and "3.6 GiB every 20m00s" in f.message
    assert f.evidence["saves_left"] == 5
    # Closer than an hour to the failing save: critical (two more fit: 3 x 20 min - 1 min).
    near = dg.disk_full_soon(usage(500 * GB, int(8.5 * GB)), saves, now)
    assert near.severity == "critical" and near.evidence["saves_left"] == 2
    assert near.evidence["time_to_full_s"] == pytest.approx(3 * 1200 - 60)
    # A save that is late (or refused) moves the projection on instead of into the past.
    late = dg.project(u, saves, now + 3600)
    assert late.time_to_full_s == pytest.approx(5 * 1200)
    # The next one will not fit at all.
    f = dg.disk_full_soon(usage(500 * GB, 3 * GB), saves, now, prunable_bytes=int(11.7 * GB))
    assert f.severity == "critical" and "the next checkpoint will not fit" in f.message
    assert "prune would free 10.9 GiB" in f.message


def test_disk_full_soon_without_a_writer_only_when_the_next_will_not_fit() -> None:
    saves = [(1000.0 + 1200 * i, int(3.9 * GB)) for i in range(5)]
    now = saves[-1][0] + 60
    # Nobody writes (the trainer ended): a rate means nothing, five more would still fit.
    assert dg.disk_full_soon(usage(500 * GB, 20 * GB), saves, now, writing=False) is None
    # ... but "the next checkpoint will not fit" holds whoever writes it next (a resume).
    f = dg.disk_full_soon(usage(500 * GB, 3 * GB), saves, now, writing=False)
    assert f is not None and f.severity == "critical" and "the next checkpoint will not fit" in f.message
    assert f.evidence["writing"] is False
    codes = {x.code for x in dg.disk_findings(usage(500 * GB, 20 * GB), None, saves, now, writing=False)}
    assert "DISK_FULL_SOON" not in codes and "DISK_HIGH" in codes  # 96 % used stays said


def test_budget_usage_and_the_pre_save_check_within_a_budget(tmp_path: Path) -> None:
    (tmp_path / "step-000001").mkdir()
    (tmp_path / "step-000001" / "a.pt").write_bytes(b"x" * 150_000)
    outside = tmp_path.parent / f"{tmp_path.name}-outside.bin"
    outside.write_bytes(b"y" * 10_000_000)
    (tmp_path / "link").symlink_to(outside)  # counted as a link, never followed
    u = dg.budget_usage(tmp_path, 200_000)
    assert u.budget and u.used_bytes == 150_000 + len(str(outside)) and u.total_bytes == 200_000
    f = dg.disk_high(dg.budget_usage(tmp_path, 170_000))
    assert f is not None and f.message.startswith("checkpoint budget ") and f.severity == "warning"
    # The disk has room; the budget has not: refused before a byte is written.
    with pytest.raises(dg.CheckpointWontFit) as ei:
        dg.check_fit(tmp_path, 60_000, budget_bytes=200_000, root=tmp_path, reserve_bytes=0)
    assert ei.value.errno == errno.ENOSPC and "budget" in str(ei.value)
    assert (
        dg.check_fit(tmp_path, 40_000, budget_bytes=200_000, root=tmp_path, reserve_bytes=0).budget is False
    )
    outside.unlink()


def test_disk_full_soon_quiet_when_far_or_unknown() -> None:
    saves = [(0.0, GB), (3600.0, GB)]
    assert dg.disk_full_soon(usage(1000 * GB, 400 * GB), saves, 3600.0) is None  # 400 h away
    assert dg.disk_full_soon(usage(1000 * GB, GB), saves[:1], 0.0) is None  # one save: no cadence
    assert dg.project(usage(1000 * GB, GB), [(5.0, GB), (5.0, GB)], 5.0) is None


WSL_MOUNTS = r"""/dev/sdc / ext4 rw,relatime,discard,errors=remount-ro,data=ordered 0 0
none /mnt/wsl tmpfs rw,relatime 0 0
C:\134 /mnt/c 9p rw,noatime,dirsync,aname=drvfs;path=C:\;uid=1000;gid=1000;symlinkroot=/mnt/,mmap,access=client,msize=262144,trans=virtio 0 0
//nas/share /mnt/my\040nas cifs rw,relatime,vers=3.0 0 0
"""


def test_drvfs_from_proc_mounts(tmp_path: Path) -> None:
    mounts_file = tmp_path / "mounts"
    mounts_file.write_text(WSL_MOUNTS)
    mounts = dg.read_mounts(mounts_file)
    assert [m.mountpoint for m in mounts] == ["/", "/mnt/wsl", "/mnt/c", "/mnt/my nas"]
    m = dg.mount_of("/mnt/c/Users/me/ckpt", mounts)
    assert m is not None and m.fstype == "9p" and m.remote
    f = dg.drvfs_checkpoints("/mnt/c/Users/me/ckpt", m)
    assert f is not None and f.code == "DRVFS_CHECKPOINTS" and "9p (drvfs" in f.message
    assert "native Linux directory" in f.message
    nas = dg.mount_of("/mnt/my nas/ck", mounts)
    assert (
        nas is not None and nas.fstype == "cifs" and dg.drvfs_checkpoints("/mnt/my nas/ck", nas) is not None
    )
    home = dg.mount_of("/home/me/ckpt", mounts)
    assert home is not None and home.mountpoint == "/" and dg.drvfs_checkpoints("/home/me/ckpt", home) is None
    assert dg.mount_of("/mnt/cx", mounts).mountpoint == "/"  # a prefix of the name is not a parent


def test_real_proc_mounts_has_the_root() -> None:
    m = dg.mount_of("/", dg.read_mounts())
    assert m is not None and m.mountpoint == "/"


def test_check_fit_refuses_with_enospc(tmp_path: Path) -> None:
    with pytest.raises(dg.CheckpointWontFit) as ei:
        dg.check_fit(tmp_path, 4 * GB, statvfs=statvfs_of(100 * GB, 3 * GB))
    assert (
        ei.value.errno == errno.ENOSPC
        and "will not fit" in str(ei.value)
        and "trainroom prune" in str(ei.value)
    )
    assert dg.check_fit(tmp_path, 4 * GB, statvfs=statvfs_of(100 * GB, 5 * GB)).free_bytes == 5 * GB
    # The reserve: 256 MiB, or 2 % of a small disk.
    assert dg.reserve_for(usage(100 * GB, GB)) == 256 << 20
    assert dg.reserve_for(usage(3 << 20, 3 << 20)) == int((3 << 20) * 0.02)


def test_disk_findings_together(tmp_path: Path) -> None:
    mounts_file = tmp_path / "mounts"
    mounts_file.write_text(WSL_MOUNTS)
    m = dg.mount_of("/mnt/c/ck", dg.read_mounts(mounts_file))
    u = usage(100 * GB, 5 * GB, path="/mnt/c/ck")
    saves = [(0.0, 4 * GB), (60.0, 4 * GB)]
    codes = {f.code: f.severity for f in dg.disk_findings(u, m, saves, 61.0)}
    assert codes == {"DISK_HIGH": "critical", "DISK_FULL_SOON": "critical", "DRVFS_CHECKPOINTS": "warning"}


def test_budget_usage_of_a_real_root(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"x" * 9000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"y" * 1000)
    u = dg.budget_usage(tmp_path, 11_000)
    assert u.used_bytes == 10_000 and u.free_bytes == 1000
    f = dg.disk_high(u)
    assert f is not None and f.severity == "warning"  # 10000 / 11000 = 90.9 %
    assert dg.budget_usage(tmp_path, 5000).free_bytes == 0


def test_the_saves_skipped_are_counted_and_named_with_the_steps_at_risk() -> None:
    saves = [(1000.0 + 10 * i, int(3.9 * GB)) for i in range(5)]
    now = saves[-1][0] + 5
    full = usage(500 * GB, 3 * GB)
    (soon,) = [f for f in dg.disk_findings(full, None, saves, now) if f.code == "DISK_FULL_SOON"]
    assert "the next checkpoint will not fit" in soon.message  # nothing skipped yet
    skipped = dg.Skipped(steps=(41, 42, 43, 44), last_verified_step=40)
    (soon,) = [
        f for f in dg.disk_findings(full, None, saves, now, skipped=skipped) if f.code == "DISK_FULL_SOON"
    ]
    assert "the next checkpoint will not fit" not in soon.message
    assert ": 4 saves skipped (steps 41–44), they do not fit; 4 steps at risk since the last verified " in (
        soon.message
    )
    assert soon.evidence["skipped"] == 4 and soon.evidence["steps_at_risk"] == 4
    # Two more skipped: the count and the steps at risk grow with them.
    more = dg.Skipped(steps=(41, 42, 43, 44, 45, 46), last_verified_step=40)
    (soon,) = [
        f for f in dg.disk_findings(full, None, saves, now, skipped=more) if f.code == "DISK_FULL_SOON"
    ]
    assert "6 saves skipped (steps 41–46)" in soon.message and soon.evidence["steps_at_risk"] == 6
    none = dg.Skipped(steps=(7,), last_verified_step=None)
    (soon,) = [
        f for f in dg.disk_findings(full, None, saves, now, skipped=none) if f.code == "DISK_FULL_SOON"
    ]
    assert (
        "1 save skipped (step 7), it does not fit; 7 steps at risk: no checkpoint has verified yet"
        in soon.message
    )


def test_status_says_the_budget_and_the_disk_apart() -> None:
    from trainroom.core.run.status_text import _disk

    budget = {"used_fraction": 0.928, "budget_bytes": 160 << 20, "filesystem_used_fraction": 0.26}
    assert _disk(budget) == "budget 93% used (of 160 MiB)  disk 26% used"
    assert _disk({"used_fraction": 0.26, "budget_bytes": None}) == "disk 26% used"


def test_a_checkpoint_s_files_are_one_save_and_a_copy_keeps_its_trainer_s_time() -> None:
    # A 4-rank sharded save every 10 min (each rank's file reported a moment apart): one save of
    # all 4 shards; the cadence is 10 min, never the milliseconds between shards.
    saves: list[tuple[float, int, int]] = []
    for i in range(3):
        for r in range(4):
            dg.record_save(saves, 100.0 + 600 * i + 0.01 * r, GB, step=100 * (i + 1))
    assert [(t, s) for t, s, _ in saves] == [(100.0, 4 * GB), (700.0, 4 * GB), (1300.0, 4 * GB)]
    u = usage(1000 * GB, 100 * GB)
    proj = dg.project(u, [(t, s) for t, s, _ in saves], 1400.0)
    assert proj is not None and proj.cadence_s == pytest.approx(600) and proj.checkpoint_bytes == 4 * GB
    assert "every 10m00s" in dg.disk_full_soon(u, [(t, s) for t, s, _ in saves], 1400.0).message
    # A new step starts a new entry, even within a second of the last (a trainer saving every step).
    dg.record_save(saves, 1300.2, GB, step=400)
    assert len(saves) == 4 and saves[-1] == (1300.2, GB, 400)

"""Cached directory listings (probes.listing): a directory unchanged since it was listed is not
listed again; an entry added, removed or renamed is seen on the next call; a directory changed
within the racy window is listed again whatever its mtime says. Real directories."""

from __future__ import annotations

import os
import time
from pathlib import Path

from trainroom.core.ckpt import targets
from trainroom.core.probes import listing


def _age(path: Path, seconds: float = 60.0) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_an_unchanged_directory_is_listed_once_and_a_change_is_seen(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}.txt").touch()
    (tmp_path / "step=20.ckpt").touch()
    _age(tmp_path)
    before = listing.scans
    first = listing.entries(tmp_path)
    assert [e.name for e in first][:2] == ["f0.txt", "f1.txt"] and len(first) == 51
    assert listing.entries(tmp_path) is first and listing.scans == before + 1
    assert [u.name for u in targets.units_in(tmp_path)] == ["step=20.ckpt"]
    (tmp_path / "step=40.ckpt").touch()  # the directory's mtime moves: listed again
    assert [u.name for u in targets.units_in(tmp_path)] == ["step=20.ckpt", "step=40.ckpt"]
    os.rename(tmp_path / "step=20.ckpt", tmp_path / "step=60.ckpt")
    assert [u.name for u in targets.units_in(tmp_path)] == ["step=40.ckpt", "step=60.ckpt"]


def test_a_directory_changed_within_the_racy_window_is_listed_again(tmp_path: Path) -> None:
    (tmp_path / "a").touch()
    before = listing.scans
    listing.entries(tmp_path)
    listing.entries(tmp_path)  # its mtime is now: not trusted, listed again
    assert listing.scans == before + 2


def test_entry_types_come_without_following_symlinks(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").touch()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    got = {e.name: (e.is_dir, e.is_file, e.is_symlink) for e in listing.entries(tmp_path)}
    assert got == {"d": (True, False, False), "f": (False, True, False), "link": (False, False, True)}


def test_tree_bytes_counts_every_file_and_a_big_data_directory_slowly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(listing.BIG_DIR):
        (data / f"x{i}").write_bytes(b"12")
    (tmp_path / "model.pt").write_bytes(b"x" * 100)
    _age(data)
    assert listing.tree_bytes(tmp_path) == 2 * listing.BIG_DIR + 100
    # A file of the data directory grows in place (its directory's mtime stays): counted at the
    # next slow measure; a checkpoint file at the top is counted at once.
    (data / "x0").write_bytes(b"1234")
    (tmp_path / "model.pt").write_bytes(b"x" * 300)
    assert listing.tree_bytes(tmp_path) == 2 * listing.BIG_DIR + 300

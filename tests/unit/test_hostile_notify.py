"""`notify --test` never runs a command the user did not name or trust: with no live run, the
[notify] command of a trainroom.toml others can write (or another user owns) is listed in full and
not run; named with --config it runs, shown in full (URL secrets redacted) before it does."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path


def _notify(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "notify", "--test", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRAINROOM_HOME": str(home)},
        stdin=subprocess.DEVNULL,
    )


def test_a_command_from_an_untrusted_file_is_shown_not_run_and_a_named_one_runs(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir(mode=0o700)
    project.mkdir()
    marker = tmp_path / "ran"
    hook = shlex.join(
        [
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w').write('x')",
            "https://user:s3cret@hooks.example/x",
        ]
    )
    toml = project / "trainroom.toml"
    toml.write_text(f"[notify]\ncommand = '''{hook}'''\n")
    toml.chmod(0o666)
    out = _notify(project, home)
    assert out.returncode == 1 and not marker.exists(), out.stdout + out.stderr
    assert "not run: it comes from" in out.stdout and "is mode 0666 (others can write it)" in out.stdout
    assert f"--config {toml}" in out.stdout
    assert (
        "s3cret" not in out.stdout and "hooks.example" in out.stdout
    )  # the command in full, the URL's secret not
    assert sys.executable in out.stdout

    toml.chmod(0o644)
    os.chown(toml, 65534, 65534)
    out = _notify(project, home)
    assert not marker.exists() and "is owned by uid 65534, not you" in out.stdout, out.stdout

    out = _notify(tmp_path, home, "--config", str(toml))  # named: trusted
    assert out.returncode == 0 and marker.exists(), out.stdout + out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith("running command hook: ") and sys.executable in first and "s3cret" not in first

    marker.unlink()
    os.chown(toml, os.geteuid(), os.getegid())  # the user's own file, private: trusted
    out = _notify(project, home)
    assert out.returncode == 0 and marker.exists(), out.stdout + out.stderr

"""A replay's writes kept out of the run it replays, whatever the trainer writes and however.

`save_checkpoint` in a replay already saves into the replay's scratch root; a trainer that writes
its own files (`torch.save(..., "out/ckpt.pt")`, a log directory, a hard-coded output path) would
still write into the run's working directory, its checkpoint root and its watched paths: beside a
live run, over the very files its keeper verifies and promotes. So the replayed command runs in a
mount namespace of its own in which each of those directories is an overlay: the trainer reads
them as they are, and whatever it creates, changes or deletes there lands in the replay's scratch
directory (`upper/<n>/`), never in the directory itself. The run's keeper, in the host's
namespace, never sees those writes.

    python -m trainroom.core.ops.isolate --upper DIR --cover PATH [--cover PATH ...] [--or-plain] -- ARGV...

The namespace is a user namespace too when not root (the uid mapped to itself, so the trainer
runs as the same user and, after exec, with no capabilities); mounts are made private first, so
nothing propagates back. When the kernel refuses (user namespaces disabled or restricted, as
Ubuntu's AppArmor does, or no overlayfs), it prints one line saying so and exits CANNOT, or with
`--or-plain` says so on stderr and runs the command without isolation.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

CANNOT = 125  # the exit code when isolation is impossible (before the command ran)
MARK = "trainroom: cannot isolate the replay's writes"

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


class IsolationError(Exception):
    pass


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise IsolationError(f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def covers(paths: Sequence[str]) -> list[Path]:
    """The existing directories among `paths`, resolved, without those inside another one."""
    found: list[Path] = []
    for raw in paths:
        p = Path(os.path.realpath(raw))
        if os.path.isdir(p) and p not in found:
            found.append(p)
    return sorted(p for p in found if not any(q != p and inside(p, q) for q in found))


def upper_dir(wanted: Path, cover: Sequence[Path], prefix: str) -> Path:
    """Where the writes go: `wanted` (the replay's scratch directory), unless it lies inside a
    directory it covers (a state dir under the run's cwd: overlayfs refuses an upper inside its
    lower), then a new directory in the temp dir when that lies outside them all."""
    real = Path(os.path.realpath(wanted))
    if not any(inside(real, c) for c in cover):
        return wanted
    tmp = Path(os.path.realpath(tempfile.gettempdir()))
    if any(inside(tmp, c) for c in cover):
        return wanted  # nowhere outside: enter() says why
    return Path(tempfile.mkdtemp(prefix=prefix, dir=tmp))


def enter(cover: Sequence[Path], upper: Path) -> list[tuple[Path, Path]]:
    """Enter a new mount namespace (and user namespace when not root) and lay an overlay on each
    covered directory, its writes into `upper/<n>`. Returns (directory, where its writes go).
    Raises IsolationError, saying why, when the kernel will not."""
    for c in cover:
        if inside(upper, c):
            raise IsolationError(f"the replay's scratch directory {upper} is inside {c}, which it must cover")
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | (0 if uid == 0 else CLONE_NEWUSER)
    _check(libc.unshare(flags), "a mount namespace (unshare)" + ("" if uid == 0 else " in a user namespace"))
    if uid != 0:
        try:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        except OSError as exc:
            raise IsolationError(f"mapping the user namespace: {exc.strerror or exc}") from None
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
    done: list[tuple[Path, Path]] = []
    for n, c in enumerate(cover):
        up, work = upper / "upper" / str(n), upper / "work" / str(n)
        up.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        base = f"lowerdir={c},upperdir={up},workdir={work}"
        tries = [base + ",userxattr", base] if uid != 0 else [base]
        for i, opts in enumerate(tries):
            rc = libc.mount(b"overlay", os.fsencode(c), b"overlay", 0, opts.encode())
            if rc == 0:
                break
            if i == len(tries) - 1:
                _check(rc, f"an overlay on {c}")
        done.append((c, up))
    return done


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainroom.core.ops.isolate")
    ap.add_argument("--upper", required=True, help="where the command's writes go")
    ap.add_argument("--cover", action="append", default=[], help="a directory whose writes are redirected")
    ap.add_argument("--or-plain", action="store_true", help="run without isolation when it is impossible")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        print("trainroom: isolate: no command given", file=sys.stderr)
        return 2
    cwd = os.getcwd()
    try:
        enter(covers(a.cover), Path(os.path.realpath(a.upper)))
    except IsolationError as exc:
        line = f"{MARK}: {exc}"
        if not a.or_plain:
            print(line, file=sys.stderr, flush=True)
            return CANNOT
        print(
            f"{line}: it runs without isolation, so files it writes itself land where it writes them",
            file=sys.stderr,
            flush=True,
        )
    # The working directory again, by its path: the process still stood in the directory
    # under the overlay, where a relative write would bypass it.
    os.chdir(cwd)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"trainroom: the replay could not start: {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())

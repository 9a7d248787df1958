"""Where runs live: the state dir, run ids, the run record, and finding a run by a name."""

from __future__ import annotations

import os
import re
import secrets
import stat
import time
from pathlib import Path
from typing import Protocol

import msgspec
import psutil

from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.journal import file as journal
from trainroom.core.journal import replay, segments
from trainroom.core.probes.adopt import Adoptee
from trainroom.core.probes.procs import same_start
from trainroom.core.probes.runof import run_of
from trainroom.core.run.address import is_remote
from trainroom.core.run.fold import RunFold
from trainroom.core.run.state import RunState
from trainroom.core.run.view import RunView
from trainroom.core.wire import protocol as p

SOCKET_NAME = "keeper.sock"
RECORD_NAME = "run.msgpack"
JOURNAL_NAME = segments.ACTIVE_NAME  # the active segment (see run.segments)
LOG_NAME = "trainer.log"
KEEPER_LOG_NAME = "keeper.log"
# sun_path holds 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH = 107


class RunError(Exception):
    """A run that cannot be found or made: the CLI prints it on one line and exits 2."""


class RunRecord(msgspec.Struct, kw_only=True):
    run_id: str
    argv: list[str]
    cwd: str
    created: float
    options: LaunchOptions = msgspec.field(default_factory=LaunchOptions)
    # The checkpoint root the keeper resolved (settings.checkpoint_root) and exported to the trainer
    # as TRAINROOM_CKPT_ROOT: what `prune` and `verify` use once the keeper is gone.
    ckpt_root: str | None = None
    # Why the keeper never came up (set by `launch`); such a run reads as `failed`.
    start_error: str | None = None
    keeper_pid: int | None = None
    keeper_start_time: float | None = None
    keeper_start_ticks: int | None = None
    # A trainer trainroom did not start, adopted by `trainroom attach` (None: a launched run): what
    # was read of it then, which a kill proves its target against and a takeover relaunches.
    attached: Adoptee | None = None

    def checkpoint_root(self, run_dir: str | Path) -> Path:
        """Where this run's checkpoints are: what its keeper resolved, else what launch was
        told, else the default under the run dir (a keeper that never started)."""
        return Path(self.ckpt_root or self.options.ckpt_root or Path(run_dir) / "checkpoints")


class RunInfo(msgspec.Struct, kw_only=True):
    run_id: str
    run_dir: str
    sock: str
    created: float
    argv: list[str]
    alive: bool  # the keeper is running and its socket exists
    # A run on another host: its node's address (ssh://user@host:port). Then `sock` and
    # `run_dir` are both the run's address (ssh://.../RUN): the client dials it through the
    # remote bridge, and `load_view` reads the journal there.
    remote: str | None = None
    host: str | None = None  # the host name its keeper's machine gives (remote runs)


class RunUnreachable(RunError):
    """A remote run's host did not answer (or the link dropped): not a verdict on the run."""


def state_dir() -> Path:
    env = os.environ.get("TRAINROOM_HOME")
    if env:
        # Absolute: a keeper runs in its run directory, and a relative home would mean another place there.
        return Path(env).expanduser().absolute()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state"
    return base / "trainroom"


def runs_dir() -> Path:
    return state_dir() / "runs"


def pin_home() -> None:
    """Resolve a relative TRAINROOM_HOME once, against the caller's cwd, for this process and
    every one it starts (keepers and trainers run elsewhere)."""
    if os.environ.get("TRAINROOM_HOME"):
        os.environ["TRAINROOM_HOME"] = str(state_dir())


def state_dir_warning() -> str | None:
    """Why the state dir is too open for the runs in it (another user could read their logs), or
    None. Said by `status` and `doctor`; never changed on the user's behalf."""
    d = state_dir()
    try:
        st = d.stat()
    except OSError:
        return None
    mode = st.st_mode & 0o7777
    if st.st_uid == os.geteuid() and not mode & 0o077:
        return None
    return (
        f"state dir {d} is mode {mode:04o}, owner uid {st.st_uid}: other users can list its runs "
        "(each run's own 0700 directory keeps its journal, log and socket private); "
        "`trainroom doctor` says how to fix it"
    )


def ensure_state_dir() -> Path:
    """The state dir, created private (0700) when missing, whoever creates it first (a demo, a
    launch, the theme `t` remembers); an existing one keeps its own mode (`state_dir_warning`)."""
    d = state_dir()
    if not d.exists():
        d.parent.mkdir(parents=True, exist_ok=True)
        d.mkdir(mode=0o700, exist_ok=True)
    return d


def not_ours(d: Path, *, sticky_ok: bool = True) -> str | None:
    """Why trainroom will not keep runs in directory `d` (None: it is ours, or absent): owned by
    another user, or writable by the group or others (unless sticky, where others cannot rename
    or remove our entries: a shared 1777 dir; never for runs/ itself). git's safe.directory is the
    model: a directory another user can write into may hold files planted for us to write through."""
    try:
        st = d.lstat()
    except OSError:
        return None
    mode = st.st_mode & 0o7777
    if stat.S_ISLNK(st.st_mode):
        try:
            st = d.stat()
        except OSError:
            return None
        mode = st.st_mode & 0o7777
    if st.st_uid != os.geteuid():
        return (
            f"{d} is owned by uid {st.st_uid}, not you (uid {os.geteuid()}): another user could plant files there "
            f"for your runs to write through; use a state dir of your own (TRAINROOM_HOME=...) or "
            f"`chown {os.geteuid()} {d}` if it is yours"
        )
    if mode & 0o022 and not (sticky_ok and mode & stat.S_ISVTX):
        return (
            f"{d} is mode {mode:04o}: writable by its group or others, who could plant files there for your "
            f"runs to write through; `chmod go-w {d}` (or 700), or use another state dir (TRAINROOM_HOME=...)"
        )
    return None


def ensure_runs_dir() -> Path:
    """The runs directory, created if missing. Only directories created here get the private
    mode (0700); an existing state dir keeps its own (a shared 1777 /tmp/x, a project's cwd), and
    `doctor`/`status` warn when it is too open. Each run dir is created 0700, which is what keeps
    its keeper's socket private."""
    d = runs_dir()
    refused = not_ours(d.parent) or not_ours(d, sticky_ok=False)
    if refused is not None:
        raise RunError(refused)
    try:
        ensure_state_dir()
        d.mkdir(mode=0o700, exist_ok=True)
        probe = d / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise RunError(f"state dir {d.parent} is not writable: {exc.strerror or exc}") from None
    return d


_RUN_ID = re.compile(r"\d{8}-\d{6}-(.+)-[0-9a-f]{4}")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:24] or "run"


def run_name(run_id: str) -> str | None:
    """The name in a run's id (`20261206-124717-NAME-4ec9`), or None for an id of another shape."""
    m = _RUN_ID.fullmatch(run_id)
    return m.group(1) if m else None


def new_run_id(argv: list[str], name: str | None = None) -> str:
    """A sortable id that names what runs: `name` when given, else the last `-m module` or
    script in the command."""
    given, name = name, "run"
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv):
            name = argv[i + 1].rsplit(".", 1)[-1]
        elif a.endswith(".py"):
            name = os.path.basename(a).removesuffix(".py")
    name = given or name
    if name == "run" and argv:
        name = os.path.basename(argv[0])
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(name)}-{secrets.token_hex(2)}"


def create_run(
    argv: list[str], cwd: str, options: LaunchOptions, *, name: str | None = None
) -> tuple[Path, RunRecord]:
    root = ensure_runs_dir()
    run_id = new_run_id(argv, name)
    run_dir = root / run_id
    sock = run_dir / SOCKET_NAME
    if len(str(sock)) > MAX_SOCKET_PATH:
        raise RunError(
            f"state dir path too long for a Unix socket ({len(str(sock))} > {MAX_SOCKET_PATH} bytes): "
            "set TRAINROOM_HOME to a shorter path"
        )
    run_dir.mkdir(mode=0o700)
    rec = RunRecord(run_id=run_id, argv=argv, cwd=cwd, created=time.time(), options=options)
    write_record(run_dir, rec)
    return run_dir, rec


def write_record(run_dir: Path, rec: RunRecord) -> None:
    tmp = run_dir / (RECORD_NAME + ".tmp")
    with open(tmp, "wb") as f:
        f.write(msgspec.msgpack.encode(rec))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, run_dir / RECORD_NAME)


def read_record(run_dir: Path) -> RunRecord:
    """The run's record; when it is damaged (or gone) but the journal holds the run's start, the
    record rebuilt from there (the run stays listed, its keeper still found by pid)."""
    try:
        return msgspec.msgpack.decode((run_dir / RECORD_NAME).read_bytes(), type=RunRecord)
    except FileNotFoundError:
        rebuilt = _record_from_journal(run_dir)
        if rebuilt is None:
            raise RunError(f"{run_dir} is not a run (no {RECORD_NAME})") from None
        return rebuilt
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        rebuilt = _record_from_journal(run_dir)
        if rebuilt is None:
            raise RunError(f"{run_dir / RECORD_NAME}: unreadable run record: {exc}") from None
        return rebuilt


REBUILD_RECORDS = 256  # how far into the first segment the run's start is looked for


def _record_from_journal(run_dir: Path) -> RunRecord | None:
    """A run record from the journal's first records: the keeper that started (pid, start tick)
    and the first attempt (argv, cwd). None without both."""
    first = segments.sealed(run_dir)
    path = Path(first[0].path) if first else run_dir / JOURNAL_NAME
    keeper: p.KeeperStarted | None = None
    try:
        for n, (_off, _end, rec) in enumerate(journal.read_frames(path)):
            if isinstance(rec, p.KeeperStarted) and keeper is None:
                keeper = rec
            elif isinstance(rec, p.AttemptStarted):
                return RunRecord(
                    run_id=run_dir.name,
                    argv=rec.argv,
                    cwd=rec.cwd,
                    created=keeper.t if keeper is not None else rec.t,
                    keeper_pid=keeper.pid if keeper is not None else None,
                    keeper_start_time=keeper.t if keeper is not None else None,
                    keeper_start_ticks=keeper.start_ticks if keeper is not None else None,
                )
            if n >= REBUILD_RECORDS:
                break
    except OSError:
        return None
    return None


def last_write(info: RunInfo) -> float | None:
    """When a local run's journal was last written: the latest its keeper is known to have
    lived, once it is gone (None: a remote run, or no journal)."""
    if info.remote:
        return None
    try:
        return (Path(info.run_dir) / JOURNAL_NAME).stat().st_mtime
    except OSError:
        return None


def keeper_alive(rec: RunRecord) -> bool:
    if rec.keeper_pid is None:
        return False
    try:
        proc = psutil.Process(rec.keeper_pid)
        if rec.keeper_start_time is not None and not same_start(
            rec.keeper_pid, rec.keeper_start_time, rec.keeper_start_ticks
        ):
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def list_runs() -> list[RunInfo]:
    root = runs_dir()
    out: list[RunInfo] = []
    try:
        if not root.is_dir():
            return out
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise RunError(f"state dir {root} is not readable: {exc.strerror or exc}") from None
    for d in entries:
        if not (d / RECORD_NAME).is_file() and not (d / JOURNAL_NAME).is_file():
            continue
        try:
            rec = read_record(d)
        except RunError:
            continue
        sock = d / SOCKET_NAME
        out.append(
            RunInfo(
                run_id=rec.run_id,
                run_dir=str(d),
                sock=str(sock),
                created=rec.created,
                argv=rec.argv,
                alive=keeper_alive(rec) and sock.exists(),
            )
        )
    out.sort(key=lambda r: (r.created, r.run_id))
    return out


class RemoteRuns(Protocol):
    """Runs on other hosts, as their hosts resolve and replay them (raising RunUnreachable when
    the host is not reached, RunError when it refuses)."""

    def run(self, spec: str, job: str | None) -> RunInfo: ...

    def view(self, address: str) -> RunView: ...


# Installed by the remote package (`remote.reach.install`) in the processes that reach other hosts.
REMOTE: RemoteRuns | None = None


def _remote() -> RemoteRuns:
    if REMOTE is None:
        raise RunError("a run on another host is reached through trainroom's command line (no ssh here)")
    return REMOTE


def remote_run(spec: str, *, job: str | None = None) -> RunInfo:
    """The run an `ssh://[user@]host[:port][/RUN]` target names, as its host resolves it (RUN
    omitted: that host's newest run, or its newest run of `job`)."""
    return _remote().run(spec, job)


def resolve_run(spec: str | None, live_only: bool = False) -> RunInfo:
    """RUN may be omitted (the newest), a full id, a unique prefix or suffix, the name it was
    given (`--name`, the id's middle: the newest run of that name), a run dir path, or
    `ssh://[user@]host[:port][/RUN]` (a run on another host, resolved there)."""
    if spec and is_remote(spec):
        return remote_run(spec)
    runs = list_runs()
    if spec and os.sep in spec and Path(spec, RECORD_NAME).is_file():
        rec = read_record(Path(spec))
        return next(
            (r for r in runs if r.run_id == rec.run_id),
            RunInfo(
                run_id=rec.run_id,
                run_dir=spec,
                sock=str(Path(spec) / SOCKET_NAME),
                created=rec.created,
                argv=rec.argv,
                alive=keeper_alive(rec),
            ),
        )
    pool = [r for r in runs if r.alive] if live_only else runs
    if not spec:
        if not pool:
            raise RunError(f"no {'live ' if live_only else ''}runs under {runs_dir()}")
        return pool[-1]
    exact = [r for r in runs if r.run_id == spec]
    if exact:
        return exact[0]
    hits = [r for r in runs if r.run_id.startswith(spec) or r.run_id.endswith(spec)]
    if len(hits) == 1:
        return hits[0]
    named = [r for r in runs if run_name(r.run_id) in (spec, _slug(spec))]
    if not hits and named:
        return named[-1]  # list_runs is oldest first
    if not hits:
        raise RunError(f"unknown run {spec!r} (see `trainroom runs`)")
    raise RunError(f"run {spec!r} is ambiguous: {', '.join(h.run_id for h in hits[:5])}")


def empty_view(rec: RunRecord) -> RunView:
    """The view of a run before its first record: what a fold from the very start begins with."""
    return RunView(
        RunState(
            run_id=rec.run_id, argv=rec.argv, cwd=rec.cwd, created=rec.created, options=rec.options.shown()
        )
    )


def fold_of(rec: RunRecord) -> RunFold:
    """How the journal engine folds this run's records (from `empty_view`)."""
    return RunFold(lambda: empty_view(rec))


def load_state(run_dir: str | Path) -> RunState:
    """Rebuild the run from its record and journal, for when its keeper is gone."""
    return load_view(run_dir, series=False).state


def load_view(run_dir: str | Path, *, series: bool = True) -> RunView:
    """The run's state (and its plot series, unless told not to) as its journal says: from the
    newest snapshot that verifies and the records after it (see run.replay); for a remote run
    (`ssh://.../RUN`), replayed there by the bridge (or its keeper's snapshot)."""
    if is_remote(str(run_dir)):
        return _remote_view(str(run_dir))
    d = Path(run_dir)
    rec = read_record(d)
    try:
        view = replay.load(d, fold_of(rec), series=series).view
    except OSError as exc:  # a journal that is a FIFO or a directory, unreadable: this run only
        raise RunError(f"run {rec.run_id}: its journal cannot be read: {exc.strerror or exc}") from None
    if rec.start_error is not None:
        fold = view.apply if series else view.state.apply
        fold(p.RunStatus(t=rec.created, state="failed", reason=rec.start_error))
    return view


def _remote_view(address: str) -> RunView:
    return _remote().view(address)


def stop_run(run_dir: str | Path) -> None:
    """Tear a run down without asking: SIGKILL (after a SIGCONT, so a stopped one dies too) every
    process that carries this run's id in its environment and started since its first attempt,
    then the keeper if it is still the recorded one. Never a killpg: a leaderless group may hold a
    stranger by now. For tests and benchmarks; users go through the keeper's confirmed `kill`."""
    import signal

    d = Path(run_dir)
    try:
        rec = read_record(d)
        st = load_state(d)
    except RunError:
        return
    first = min((a.start_time for a in st.attempts if a.pid > 0), default=rec.created)
    for proc in _carrying(rec.run_id, since=first):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                proc.send_signal(sig)  # psutil checks the create time: never a reused pid
            except psutil.Error:
                break
    if keeper_alive(rec) and rec.keeper_pid != os.getpid():
        try:
            psutil.Process(rec.keeper_pid).kill()
        except psutil.Error:
            pass


def _carrying(run_id: str, since: float) -> list[psutil.Process]:
    """Live processes whose environment names this run (TRAINROOM_RUN), started since `since`."""
    out = []
    me = os.getpid()
    for proc in psutil.process_iter(["create_time"]):
        created = proc.info["create_time"]
        if proc.pid == me or created is None or created < since - 1.0:
            continue
        found = run_of(proc.pid)
        if found is not None and found.run == run_id:
            out.append(proc)
    return out

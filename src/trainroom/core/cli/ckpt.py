"""The checkpoint verbs: `trainroom verify` and `trainroom prune`, their arguments and what they
print. The work is `ckpt.verify` and `ops.prune`; while a run's keeper is up both go through it
(journaled, and it spares what it is verifying or resuming from), once it is gone, on the files.
Bad input is one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeAlias

import msgspec

from trainroom.core.actions.prune import Prune
from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt import targets as targets
from trainroom.core.ckpt.report import Expected, VerifyReport, decode_expected
from trainroom.core.ckpt.verify import verify
from trainroom.core.ops import prune as pruning
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, KeeperGone
from trainroom.core.units import fmt_bytes, to_json
from trainroom.core.wire import protocol as p

if TYPE_CHECKING:
    # What `ArgumentParser.add_subparsers()` returns (generic only to the type checker).
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


def add_parser(subparsers: Subcommands) -> None:
    """Both verbs on `trainroom`'s subcommands."""
    _add_verify(subparsers)
    _add_prune(subparsers)


class _BadInput(Exception):
    """One line for stderr; exit 2."""


class _NothingToDo(Exception):
    """The input was good, but there is nothing to verify (no checkpoint has verified yet) or the
    keeper refused: one line for stderr that says which; exit 1."""


# --------------------------------------------------------------------------- verify


def _human(rep: VerifyReport) -> str:
    head = "OK      " if rep.ok else "REJECTED"
    size = fmt_bytes(rep.size_bytes, unknown="?")
    lines = [f"{head} {rep.path}  {size}  {rep.digest or ''}  ({rep.seconds:.2f} s)".rstrip()]
    what = [x for x in (rep.format, rep.framework) if x]
    if rep.step is not None:
        what.append(f"step {rep.step}" + (f" (from {rep.step_source})" if rep.step_source else ""))
    if what:
        lines.append("  " + ", ".join(what))
    if not rep.ok:
        lines.append(f"  reason: {rep.reason}")
        lines += [f"  also: {x}" for x in rep.problems[1:]]
    for f in rep.files:
        mark = "ok" if f.ok else "REJECTED"
        tensors = f", tensors {f.tensors}" if f.tensors else ""
        lines.append(f"  {mark:8} {f.name}  {f.role}, {fmt_bytes(f.size_bytes)}{tensors}")
    lines += [f"  note: {x}" for x in rep.notes]
    if rep.completeness is not None:
        c = rep.completeness
        lacks = c.lacks()
        lines.append(f"  holds: {', '.join(c.held()) or 'nothing'}; lacks: {', '.join(lacks) or 'nothing'}")
        lines += [f"    {x}" for x in c.lines()]
    if rep.tensors:
        dtypes = ", ".join(f"{k} {v}" for k, v in sorted(rep.dtypes.items(), key=lambda kv: -kv[1]))
        nan = sum(v.nan for v in rep.nonfinite.values())
        inf = sum(v.inf for v in rep.nonfinite.values())
        lines.append(f"  tensors {rep.tensors} ({dtypes}); params {rep.params:,}; {nan} NaN, {inf} Inf")
        a = rep.arch
        lines.append(f"  arch: layers {a.layers}, d_model {a.d_model}, vocab {a.vocab}")
    lines += [f"  {o.kind}: {o.name} std {o.std} ({o.why})" for o in rep.outliers[:5]]
    if rep.digest_ok is True:
        lines.append("  digest matches the one recorded at save time")
    return "\n".join(lines)


def _add_verify(subparsers: Subcommands) -> None:
    """`trainroom verify [TARGET] [--json]`: exit 0 verified, 1 rejected, 2 bad input."""
    ap = subparsers.add_parser(
        "verify",
        help="verify a checkpoint (integrity, NaN/Inf, exploded tensors, arch)",
        description="Verify a checkpoint: exit 0 verified, 1 rejected, 2 bad input. A file is verified here; "
        "a run's `latest` through its keeper while the keeper is up (journaled, its warm verifier), "
        "here once it is gone.",
    )
    ap.add_argument(
        "path",
        metavar="TARGET",
        nargs="?",
        default=None,
        help="a checkpoint file (.pt, .pth, .bin, .ckpt, .safetensors), a step directory, a Hugging "
        "Face checkpoint-N/ or torch.distributed.checkpoint directory, a checkpoint root (its `latest`; "
        "a directory of checkpoint-N/ or step=N.ckpt: its highest step), or a run (its `latest`; "
        "default: the newest run)",
    )
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument(
        "--expect-json",
        metavar="JSON",
        default=None,
        help='what the file must match: {"digest": ..., "size_bytes": ..., "arch": {...}, "previous": {...}}',
    )
    ap.add_argument(
        "--no-discover", action="store_true", help="ignore the sidecar / manifest recorded beside the file"
    )
    ap.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)
    ap.set_defaults(func=run_verify)


_CKPT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar")


def _file_in(path: Path) -> Path:
    """The checkpoint a directory stands for: a step directory's file, a root's `latest`, a
    Hugging Face or DCP checkpoint directory itself, a framework root's highest step."""
    if (path / layout.MANIFEST).is_file():
        manifest = layout.read_manifest(path)
        if manifest is None:
            raise _BadInput(f"{path / layout.MANIFEST}: unreadable manifest")
        if manifest.file and (path / manifest.file).exists():
            return path / manifest.file
        raise _BadInput(f"{path}: the manifest names no file that is there")
    if (path / layout.LATEST).exists() or (path / layout.QUARANTINE).is_dir():
        latest = layout.latest_checkpoint(path)
        if latest is None:
            raise _BadInput(f"{path}: no verified checkpoint (`latest` points nowhere)")
        return latest
    kind = targets.kind_of(path)
    if targets.is_dir_kind(kind):
        return path
    newest = targets.newest_unit(path) if kind == "root" else None
    if newest is not None:
        return newest
    raise _BadInput(
        f"{path}: a directory that is neither a checkpoint (a step directory, {targets.DIR_WORDS}) "
        "nor a checkpoint root"
    )


def _run_root(info: runs.RunInfo) -> tuple[Path, int | None]:
    """The run's checkpoint root, and the number of verified checkpoints it keeps (if it says)."""
    rec = runs.read_record(Path(info.run_dir))
    return rec.checkpoint_root(info.run_dir), rec.options.keep


def _via_keeper(info: runs.RunInfo, expected: Expected | None) -> VerifyReport | None:
    """The keeper's `verify` action on its `latest` (journaled); None when the keeper is gone."""
    args: dict[str, object] = {"expected": msgspec.to_builtins(expected)} if expected else {}
    try:
        client = KeeperClient(info.sock)
        plan = client.call("verify", args, confirm=False)
        if plan.stage != "plan":
            raise _NothingToDo(f"run {info.run_id}: {plan.message}")
        reply = client.call("verify", p.confirming(args, plan.plan), confirm=True)
    except KeeperGone:
        return None
    if not reply.after:
        raise _BadInput(f"run {info.run_id}: {reply.message}")
    return msgspec.convert(reply.after, VerifyReport)


def run_verify(args: argparse.Namespace) -> int:
    try:
        try:
            expected = decode_expected(args.expect_json)
        except ValueError as exc:
            raise _BadInput(f"--expect-json {exc}") from None
        rep = _verify_target(args, expected)
    except _BadInput as exc:
        print(f"trainroom verify: {exc}", file=sys.stderr)
        return 2
    except _NothingToDo as exc:
        print(f"trainroom verify: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(f"trainroom verify: needs torch in this environment ({exc})", file=sys.stderr)
        return 2
    if args.json:
        print(to_json(rep, indent=None))
    else:
        print(_human(rep))
    return 0 if rep.ok else 1


def _verify_target(args: argparse.Namespace, expected: Expected | None) -> VerifyReport:
    target = args.path
    path = Path(target) if target else None
    if path is not None and path.is_file():
        file = path
    elif path is not None and path.is_dir():
        if (path / runs.RECORD_NAME).is_file():
            return _verify_run(str(path), expected, args)
        file = _file_in(path)
    elif path is not None and (os.sep in str(target) or str(target).endswith(_CKPT_SUFFIXES)):
        raise _BadInput(f"{path}: {'not a file' if path.exists() else 'no such file'}")
    else:
        return _verify_run(target, expected, args)
    if args.nice:
        with contextlib.suppress(OSError):
            os.nice(args.nice)
    return verify(file, expected, discover=not args.no_discover)


def _verify_run(spec: str | None, expected: Expected | None, args: argparse.Namespace) -> VerifyReport:
    try:
        info = runs.resolve_run(spec)
        root, _ = _run_root(info)
    except runs.RunError as exc:
        raise _BadInput(str(exc)) from None
    if info.alive:
        rep = _via_keeper(info, expected)
        if rep is not None:
            return rep
    latest = layout.latest_checkpoint(root) if root.is_dir() else None
    if latest is None:
        # A watched trainer's own checkpoint, verified by the keeper and still there (the journal).
        last = runs.load_state(info.run_dir).last_verified()
        latest = Path(last.path) if last is not None and Path(last.path).exists() else None
    if latest is None:
        raise _NothingToDo(
            f"run {info.run_id}: nothing to verify: no checkpoint has verified yet under {root} "
            "(`latest` points nowhere); the keeper verifies each one as it is saved (`trainroom status` "
            "lists them)"
        )
    return verify(latest, expected, discover=not args.no_discover)


# --------------------------------------------------------------------------- prune


def _add_prune(subparsers: Subcommands) -> None:
    """`trainroom prune [RUN] [--keep N] [--dry-run] [--yes] [--json] [--root PATH]`."""
    ap = subparsers.add_parser(
        "prune",
        help="delete old verified checkpoints, keeping the last N, pinned and latest",
        description="Delete old verified checkpoints, keeping the last N, pinned ones and `latest`. While the "
        "run's keeper is up this goes through it (it also spares candidates being verified and the "
        "checkpoint a resume is loading, and journals the bytes freed); once it is gone, or with "
        "--root, on the files directly. Asks first unless --yes or --dry-run.",
    )
    ap.add_argument(
        "run",
        nargs="?",
        metavar="RUN",
        help=f"the run whose checkpoints to prune (default: ${layout.ENV_ROOT} if set, else the newest run)",
    )
    ap.add_argument("--root", metavar="PATH", help="a checkpoint root instead of a run's")
    ap.add_argument(
        "--keep",
        type=int,
        default=None,
        help=f"verified checkpoints to keep (default {pruning.DEFAULT_KEEP})",
    )
    ap.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    ap.add_argument(
        "--include-rejected", action="store_true", help="also delete rejected candidates in quarantine"
    )
    ap.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.set_defaults(func=run_prune)


# Who pruned: the run's keeper, or `trainroom prune` on the files (no keeper).
PruneVia = Literal["keeper", "files"]


class PruneOutcome(msgspec.Struct, kw_only=True):
    """What `trainroom prune` did (or would do), through the keeper or on the files: `--json`."""

    via: PruneVia
    run: str | None
    root: str | None
    keep: int | None
    dry_run: bool
    ok: bool = True
    message: str = ""
    cancelled: bool = False
    deleted: list[pruning.PruneTarget] = []
    kept: list[pruning.Kept] = []
    skipped: list[pruning.Kept] = []
    failed: list[pruning.Kept] = []
    bytes_freed: int = 0
    disk_used_bytes: int | None = None


def _live_owner(root: Path) -> runs.RunInfo | None:
    """The live run whose keeper owns `root`: pruning behind its back could delete a candidate it
    is verifying or the checkpoint a resume is loading."""
    real = os.path.realpath(root)
    for info in runs.list_runs():
        if not info.alive:
            continue
        try:
            r, _ = _run_root(info)
        except runs.RunError:
            continue
        if os.path.realpath(r) == real:
            return info
    return None


def _target(args: argparse.Namespace) -> tuple[Path, runs.RunInfo | None, int | None]:
    """(root, the live run to go through or None, the run's own keep)."""
    if args.root and args.run:
        raise _BadInput("give RUN or --root, not both")
    try:
        if args.root:
            root = Path(args.root)
            return root, _live_owner(root), None
        if args.run is None and os.environ.get(layout.ENV_ROOT):
            root = layout.checkpoint_root(None)
            return root, _live_owner(root), None
        try:
            info = runs.resolve_run(args.run)
        except runs.RunError as exc:
            if args.run is None:
                raise _BadInput(f"{exc}: name a RUN, pass --root PATH or set {layout.ENV_ROOT}") from None
            raise _BadInput(str(exc)) from None
        root, keep = _run_root(info)
        if not info.alive and not root.is_dir():
            raise _BadInput(f"run {info.run_id} has no checkpoint root at {root}: pass --root PATH")
        return root, info if info.alive else None, keep
    except runs.RunError as exc:
        raise _BadInput(str(exc)) from None


def _confirm(args: argparse.Namespace, summary: str) -> bool:
    """--yes, or a y at the prompt; with no terminal to ask on, a clear refusal (exit 2)."""
    if args.yes or args.dry_run:
        return True
    if not sys.stdin.isatty():
        raise _BadInput("prune needs confirmation: pass --yes (stdin is not a terminal)")
    print(summary)
    return input("prune? [y/N] ").strip().lower() in ("y", "yes")


def _through_keeper(args: argparse.Namespace, info: runs.RunInfo, keep: int | None) -> PruneOutcome:
    req: dict[str, object] = {}
    if keep is not None:
        req["keep"] = keep
    if args.include_rejected:
        req["include_rejected"] = True
    client = KeeperClient(info.sock)
    plan = client.call("prune", req, confirm=False)
    pl = plan.plan
    shown = Prune().decode(pl)  # None: refused before planning (no root to show)
    out = PruneOutcome(
        via="keeper",
        run=info.run_id,
        root=shown.root if shown is not None else None,
        keep=shown.keep if shown is not None else None,
        dry_run=bool(args.dry_run),
        ok=plan.ok,
        message=plan.message,
        # The plan's records as the files' prune reports them (checked as they convert).
        kept=msgspec.convert(msgspec.to_builtins(shown.kept if shown else []), list[pruning.Kept]),
        skipped=msgspec.convert(msgspec.to_builtins(shown.skipped if shown else []), list[pruning.Kept]),
    )
    if not plan.ok or shown is None:
        return out
    if args.dry_run:
        out.deleted = msgspec.convert(msgspec.to_builtins(shown.delete), list[pruning.PruneTarget])
        out.bytes_freed = shown.bytes_to_free
        return out
    # The counts and what is kept first, then the paths: read before the run saves again.
    if not _confirm(args, "\n".join([plan.message, *Prune().plan_lines(shown)])):
        out.ok, out.message, out.cancelled = False, "cancelled", True
        return out
    done = client.call("prune", p.confirming(req, pl), confirm=True)
    after = done.after
    # Eligible since the confirmation (kept, unconfirmed) and confirmed but no longer eligible.
    out.kept += [
        pruning.Kept(path=a["path"], step=a.get("step"), why=pruning.ARRIVED)
        for a in after.get("arrived_since", [])
    ]
    out.kept += msgspec.convert(after.get("no_longer_eligible", []), list[pruning.Kept])
    out.ok, out.message = done.ok, done.message
    out.deleted = msgspec.convert(after.get("deleted", []), list[pruning.PruneTarget])
    out.failed = msgspec.convert(after.get("failed", []), list[pruning.Kept])
    out.bytes_freed = int(after.get("bytes_freed") or 0)
    out.disk_used_bytes = after.get("disk_used_bytes")
    return out


def _on_files(args: argparse.Namespace, root: Path, keep: int) -> PruneOutcome:
    if keep < 0:
        raise _BadInput("--keep must be 0 or more")
    if not root.is_dir():
        raise _BadInput(f"{root}: not a directory")
    pl = pruning.plan(root, keep, include_rejected=args.include_rejected)
    out = PruneOutcome(via="files", run=None, root=str(root), keep=keep, dry_run=bool(args.dry_run))
    if not pl.delete:
        out.ok = False
        out.message = (
            f"nothing to delete under {root}: {len(pl.kept)} checkpoint(s) kept (keeping {keep} verified, "
            "`latest` and pinned ones)"
        )
        out.kept, out.skipped = list(pl.kept), list(pl.skipped)
        return out
    summary = (
        f"prune {len(pl.delete)} checkpoint(s) under {root}, keeping {keep} verified: "
        f"{fmt_bytes(pl.bytes_to_free)} to free"
    )
    if not args.dry_run and pl.delete and not _confirm(args, summary):
        out.ok, out.message, out.cancelled = False, "cancelled", True
        out.kept, out.skipped = list(pl.kept), list(pl.skipped)
        return out
    res = pruning.execute(pl, dry_run=args.dry_run)
    out.ok = not res.failed
    out.deleted, out.kept, out.skipped, out.failed = res.deleted, res.kept, res.skipped, res.failed
    out.bytes_freed = res.bytes_freed
    out.message = (
        f"{'would free' if args.dry_run else 'freed'} {fmt_bytes(res.bytes_freed)} in {len(res.deleted)} "
        f"checkpoint(s) under {root}, kept {len(res.kept)}"
    )
    return out


def _print_prune(out: PruneOutcome, dry_run: bool) -> None:
    via = f"through the keeper of {out.run}" if out.via == "keeper" else "on the files"
    print(f"{out.message} ({via})")  # the summary first, the paths after
    verb = "would delete" if dry_run else "deleted"
    for t in out.deleted:
        print(f"{verb}  {t.path}  {fmt_bytes(t.bytes)}")
    for k in out.kept:
        print(f"kept     {k.path}  ({k.why})")
    for k in out.skipped + out.failed:
        print(f"skipped  {k.path}  ({k.why})")


def run_prune(args: argparse.Namespace) -> int:
    """Through the run's live keeper, else on the files: the same plan, the same output."""
    try:
        if args.keep is not None and args.keep < 0:
            raise _BadInput("--keep must be 0 or more")
        root, live, run_keep = _target(args)
        if live is not None:
            out = _through_keeper(args, live, args.keep)
        else:
            keep = args.keep if args.keep is not None else run_keep or pruning.DEFAULT_KEEP
            out = _on_files(args, root, keep)
    except _BadInput as exc:
        print(f"trainroom prune: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # KeeperGone mid-call, CheckpointError: one line, not a traceback
        print(f"trainroom prune: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(to_json(out, indent=None))
    else:
        _print_prune(out, args.dry_run)
    if out.cancelled:
        return 1
    return 0 if out.ok and not out.failed else 1

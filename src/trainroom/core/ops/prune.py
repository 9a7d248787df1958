"""Prune: free disk by deleting old verified checkpoints, keeping what a resume may need.

Kept, always: the last N verified (default 2, the seed's disk guard kept the last two), pinned
ones, the one `latest` names, anything in `protect` (the checkpoint a resume is loading, a
candidate being verified), and everything in quarantine (candidates and rejected evidence) unless
rejected ones are asked for. Never touched: anything that is not a real directory named
`step-NNNNNN` with a verified manifest directly under the root, anything whose resolved path is
outside the root, and any symlink (a link is removed at most, never followed).

`plan` is a pure function of the listing; `execute` re-checks each target just before deleting.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.ckpt import layout as ck

DEFAULT_KEEP = 2


class PruneTarget(msgspec.Struct, kw_only=True):
    path: str
    step: int | None
    bytes: int
    kind: str = "verified"  # verified | rejected


class Kept(msgspec.Struct, kw_only=True):
    path: str
    step: int | None
    why: str


class PrunePlan(msgspec.Struct, kw_only=True):
    root: str
    keep: int
    delete: list[PruneTarget] = []
    kept: list[Kept] = []
    skipped: list[Kept] = []  # entries prune will not touch, with why (a symlink, outside the root)
    bytes_to_free: int = 0


class PruneResult(msgspec.Struct, kw_only=True):
    root: str
    keep: int
    dry_run: bool
    deleted: list[PruneTarget] = []
    kept: list[Kept] = []
    skipped: list[Kept] = []
    failed: list[Kept] = []
    bytes_freed: int = 0


def _inside(root_real: str, path: str | os.PathLike[str]) -> bool:
    real = os.path.realpath(path)
    return real != root_real and real.startswith(root_real.rstrip("/") + "/")


def plan(
    root: str | os.PathLike[str],
    keep: int = DEFAULT_KEEP,
    *,
    protect: Iterable[str | os.PathLike[str]] = (),
    include_rejected: bool = False,
) -> PrunePlan:
    """What prune would delete and keep, and why, without deleting anything."""
    if keep < 0:
        raise ValueError("keep must be >= 0")
    root_p = Path(root).absolute()
    root_real = os.path.realpath(root_p)
    out = PrunePlan(root=str(root_p), keep=keep)
    # Protected paths, resolved: a file inside a step dir protects its directory.
    protected: set[str] = set()
    for x in protect:
        real = os.path.realpath(x)
        protected.add(real)
        protected.add(os.path.dirname(real))
    latest = ck.latest_dir(root_p)
    latest_real = os.path.realpath(latest) if latest else None
    pointer = root_p / ck.LATEST
    if pointer.is_symlink() and latest is None:
        out.skipped.append(
            Kept(
                path=str(pointer),
                step=None,
                why=f"latest -> {os.readlink(pointer)} is not a verified step dir here: not followed",
            )
        )

    verified = ck.verified_checkpoints(root_p)
    listed = {os.path.basename(v.dir) for v in verified}
    try:
        entries = sorted(root_p.iterdir())
    except FileNotFoundError:
        return out
    for e in entries:
        if e.name in listed or e.name in (ck.LATEST, ck.QUARANTINE) or e.name.startswith("."):
            continue
        if e.is_symlink():
            out.skipped.append(
                Kept(path=str(e), step=None, why=f"symlink to {os.readlink(e)}: never followed")
            )
        elif ck.STEP_DIR_RE.match(e.name):
            out.skipped.append(
                Kept(path=str(e), step=None, why="no verified manifest: not a promoted checkpoint")
            )

    newest = {v.dir for v in verified[-keep:]} if keep else set()
    for v in reversed(verified):
        real = os.path.realpath(v.dir)
        why = None
        if not _inside(root_real, v.dir):
            out.skipped.append(Kept(path=v.dir, step=v.step, why="resolves outside the root"))
            continue
        if real == latest_real:
            why = "latest"
        elif real in protected:
            why = "in use (resume or verification)"
        elif v.pinned:
            why = "pinned"
        elif v.dir in newest:
            why = f"one of the last {keep} verified"
        if why:
            out.kept.append(Kept(path=v.dir, step=v.step, why=why))
        else:
            out.delete.append(PruneTarget(path=v.dir, step=v.step, bytes=v.size_bytes))
    if include_rejected:
        q = ck.Quarantine(root_p)
        for f in q.rejected():
            if os.path.realpath(f) in protected or f.is_symlink() or not _inside(root_real, f):
                continue
            side = [Path(str(f) + s) for s in (ck.REASON_SUFFIX, ck.REPORT_SUFFIX, ck.SAVED_SUFFIX)]
            size = sum(x.lstat().st_size for x in [f, *side] if os.path.lexists(x))
            out.delete.append(PruneTarget(path=str(f), step=None, bytes=size, kind="rejected"))
    out.bytes_to_free = sum(t.bytes for t in out.delete)
    return out


def execute(
    pl: PrunePlan, *, dry_run: bool = False, protect: Iterable[str | os.PathLike[str]] = ()
) -> PruneResult:
    """Delete what the plan lists, re-checking each target first (it may have changed)."""
    res = PruneResult(
        root=pl.root, keep=pl.keep, dry_run=dry_run, kept=list(pl.kept), skipped=list(pl.skipped)
    )
    root_real = os.path.realpath(pl.root)
    latest = ck.latest_dir(pl.root)
    latest_real = os.path.realpath(latest) if latest else None
    protected = {os.path.realpath(x) for x in protect} | {
        os.path.dirname(os.path.realpath(x)) for x in protect
    }
    for t in pl.delete:
        p_ = Path(t.path)
        refuse = None
        if p_.is_symlink():
            refuse = "became a symlink"
        elif not _inside(root_real, p_) or os.path.dirname(os.path.realpath(p_)) not in (
            root_real,
            os.path.join(root_real, ck.QUARANTINE),
        ):
            refuse = "outside the root"
        elif os.path.realpath(p_) == latest_real:
            refuse = "is latest now"
        elif os.path.realpath(p_) in protected:
            refuse = "in use"
        if refuse:
            res.failed.append(Kept(path=t.path, step=t.step, why=f"not deleted: {refuse}"))
            continue
        if dry_run:
            res.deleted.append(t)
            res.bytes_freed += t.bytes
            continue
        try:
            if t.kind == "rejected":
                for s in ("", ck.REASON_SUFFIX, ck.REPORT_SUFFIX, ck.SAVED_SUFFIX):
                    x = Path(t.path + s)
                    if os.path.lexists(x):
                        x.unlink()
            else:
                # rmtree never follows a symlink inside the tree (it unlinks the link itself).
                shutil.rmtree(p_)
        except OSError as exc:
            res.failed.append(Kept(path=t.path, step=t.step, why=f"not deleted: {exc.strerror or exc}"))
            continue
        res.deleted.append(t)
        res.bytes_freed += t.bytes
    if res.deleted and not dry_run:
        ck.fsync_dir(pl.root)
    return res


def prune(
    root: str | os.PathLike[str],
    keep: int = DEFAULT_KEEP,
    *,
    dry_run: bool = False,
    protect: Iterable[str | os.PathLike[str]] = (),
    include_rejected: bool = False,
) -> PruneResult:
    """Plan and execute: what the keeper's prune action calls (journal `bytes_freed` after)."""
    protect = list(protect)
    return execute(
        plan(root, keep, protect=protect, include_rejected=include_rejected), dry_run=dry_run, protect=protect
    )


# --------------------------------------------------------------------------- CLI


def add_parser(subparsers: Any) -> None:
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
        help=f"the run whose checkpoints to prune (default: ${ck.ENV_ROOT} if set, else the newest run)",
    )
    ap.add_argument("--root", metavar="PATH", help="a checkpoint root instead of a run's")
    ap.add_argument(
        "--keep", type=int, default=None, help=f"verified checkpoints to keep (default {DEFAULT_KEEP})"
    )
    ap.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    ap.add_argument(
        "--include-rejected", action="store_true", help="also delete rejected candidates in quarantine"
    )
    ap.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.set_defaults(func=run)


class _BadInput(Exception):
    """One line for stderr; exit 2."""


def _run_root(info: Any) -> tuple[Path, int | None]:
    from trainroom.core.run import store as runs

    rec = runs.read_record(Path(info.run_dir))
    return rec.checkpoint_root(info.run_dir), rec.options.keep


def _live_owner(root: Path) -> Any:
    """The live run whose keeper owns `root`: pruning behind its back could delete a candidate it
    is verifying or the checkpoint a resume is loading."""
    from trainroom.core.run import store as runs

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


def _target(args: argparse.Namespace) -> tuple[Path, Any, int | None]:
    """(root, the live run to go through or None, the run's own keep)."""
    from trainroom.core.run import store as runs

    if args.root and args.run:
        raise _BadInput("give RUN or --root, not both")
    try:
        if args.root:
            root = Path(args.root)
            return root, _live_owner(root), None
        if args.run is None and os.environ.get(ck.ENV_ROOT):
            root = ck.checkpoint_root(None)
            return root, _live_owner(root), None
        try:
            info = runs.resolve_run(args.run)
        except runs.RunError as exc:
            if args.run is None:
                raise _BadInput(f"{exc}: name a RUN, pass --root PATH or set {ck.ENV_ROOT}") from None
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


def _records(items: Any) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(x) if not isinstance(x, dict) else x for x in items]


def _through_keeper(args: argparse.Namespace, info: Any, keep: int | None) -> dict[str, Any]:
    from trainroom.core.run.client import KeeperClient

    req: dict[str, Any] = {}
    if keep is not None:
        req["keep"] = keep
    if args.include_rejected:
        req["include_rejected"] = True
    client = KeeperClient(info.sock)
    plan = client.call("prune", req, confirm=False)
    pl = plan.plan
    out: dict[str, Any] = {
        "via": "keeper",
        "run": info.run_id,
        "root": pl.get("root"),
        "keep": pl.get("keep"),
        "dry_run": bool(args.dry_run),
        "ok": plan.ok,
        "message": plan.message,
        "deleted": [],
        "kept": pl.get("kept", []),
        "skipped": pl.get("skipped", []),
        "failed": [],
        "bytes_freed": 0,
    }
    if not plan.ok:
        return out
    if args.dry_run:
        out.update(deleted=pl.get("delete", []), bytes_freed=int(pl.get("bytes_to_free") or 0))
        return out
    if not _confirm(args, plan.message):
        out.update(ok=False, message="cancelled", cancelled=True)
        return out
    done = client.call("prune", req, confirm=True)
    after = done.after
    out.update(
        ok=done.ok,
        message=done.message,
        deleted=after.get("deleted", []),
        failed=after.get("failed", []),
        bytes_freed=int(after.get("bytes_freed") or 0),
        disk_used_bytes=after.get("disk_used_bytes"),
    )
    return out


def _on_files(args: argparse.Namespace, root: Path, keep: int) -> dict[str, Any]:
    if keep < 0:
        raise _BadInput("--keep must be 0 or more")
    if not root.is_dir():
        raise _BadInput(f"{root}: not a directory")
    pl = plan(root, keep, include_rejected=args.include_rejected)
    out: dict[str, Any] = {
        "via": "files",
        "run": None,
        "root": str(root),
        "keep": keep,
        "dry_run": bool(args.dry_run),
    }
    if (
        not args.dry_run
        and pl.delete
        and not _confirm(
            args,
            f"prune {len(pl.delete)} checkpoint(s) under {root}, keeping {keep} verified: "
            f"{_gb(pl.bytes_to_free)} to free",
        )
    ):
        out.update(
            ok=False,
            message="cancelled",
            cancelled=True,
            deleted=[],
            kept=_records(pl.kept),
            skipped=_records(pl.skipped),
            failed=[],
            bytes_freed=0,
        )
        return out
    res = execute(pl, dry_run=args.dry_run)
    out.update(
        ok=not res.failed,
        deleted=_records(res.deleted),
        kept=_records(res.kept),
        skipped=_records(res.skipped),
        failed=_records(res.failed),
        bytes_freed=res.bytes_freed,
        message=f"{'would free' if args.dry_run else 'freed'} {_gb(res.bytes_freed)} in {len(res.deleted)} "
        f"checkpoint(s) under {root}, kept {len(res.kept)}",
    )
    return out


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def run(args: argparse.Namespace) -> int:
    """Through the run's live keeper, else on the files: the same plan, the same output."""
    try:
        if args.keep is not None and args.keep < 0:
            raise _BadInput("--keep must be 0 or more")
        root, live, run_keep = _target(args)
        if live is not None:
            out = _through_keeper(args, live, args.keep)
        else:
            out = _on_files(args, root, args.keep if args.keep is not None else run_keep or DEFAULT_KEEP)
    except _BadInput as exc:
        print(f"trainroom prune: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # KeeperGone mid-call, CheckpointError: one line, not a traceback
        print(f"trainroom prune: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, default=str))
    else:
        verb = "would delete" if args.dry_run else "deleted"
        for t in out["deleted"]:
            print(f"{verb}  {t['path']}  {_gb(int(t.get('bytes') or 0))}")
        for k in out["kept"]:
            print(f"kept     {k['path']}  ({k['why']})")
        for k in out["skipped"] + out["failed"]:
            print(f"skipped  {k['path']}  ({k['why']})")
        via = f"through the keeper of {out['run']}" if out["via"] == "keeper" else "on the files"
        print(f"{out['message']} ({via})")
    if out.get("cancelled"):
        return 1
    return 0 if out["ok"] and not out["failed"] else 1

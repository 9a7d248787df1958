"""The checkpoint verbs: `trainroom verify` and `trainroom prune`, their arguments and what they
print. The work is `ckpt.verify` and `ops.prune`; while a run's keeper is up both go through it
(journaled, and it spares what it is verifying or resuming from), once it is gone, on the files.
Bad input is one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.ckpt import layout as layout
from trainroom.core.ckpt import verify as verifier
from trainroom.core.ops import prune as pruning
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, KeeperGone


def add_parser(subparsers: Any) -> None:
    """Both verbs on `trainroom`'s subcommands."""
    _add_verify(subparsers)
    _add_prune(subparsers)


class _BadInput(Exception):
    """One line for stderr; exit 2."""


def _parse_expected(text: str | None) -> dict[str, Any] | None:
    try:
        return verifier.parse_expected(text)
    except ValueError as exc:
        raise _BadInput(str(exc)) from None


# --------------------------------------------------------------------------- verify


def _human(rep: Mapping[str, Any]) -> str:
    head = "OK      " if rep.get("ok") else "REJECTED"
    size = rep.get("size_bytes")
    lines = [
        f"{head} {rep.get('path')}  {_gb(size) if size is not None else '?'}  {rep.get('digest') or ''}  "
        f"({rep.get('seconds', 0):.2f} s)".rstrip()
    ]
    if not rep.get("ok"):
        lines.append(f"  reason: {rep.get('reason')}")
        lines += [f"  also: {x}" for x in (rep.get("problems") or [])[1:]]
    if rep.get("tensors"):
        dtypes = ", ".join(
            f"{k} {v}" for k, v in sorted((rep.get("dtypes") or {}).items(), key=lambda kv: -kv[1])
        )
        nan = sum(v.get("nan", 0) for v in (rep.get("nonfinite") or {}).values())
        inf = sum(v.get("inf", 0) for v in (rep.get("nonfinite") or {}).values())
        lines.append(
            f"  tensors {rep['tensors']} ({dtypes}); params {rep.get('params', 0):,}; {nan} NaN, {inf} Inf"
        )
        a = rep.get("arch") or {}
        lines.append(f"  arch: layers {a.get('layers')}, d_model {a.get('d_model')}, vocab {a.get('vocab')}")
    for o in (rep.get("outliers") or [])[:5]:
        lines.append(f"  {o['kind']}: {o['name']} std {o['std']} ({o['why']})")
    if rep.get("digest_ok") is True:
        lines.append("  digest matches the one recorded at save time")
    return "\n".join(lines)


def _configure(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "path",
        metavar="TARGET",
        nargs="?",
        default=None,
        help="a checkpoint file (.pt, .pth, .bin, .safetensors), a step directory, a checkpoint "
        "root (its `latest`), or a run (its `latest`; default: the newest run)",
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


def _add_verify(subparsers: Any) -> None:
    """`trainroom verify [TARGET] [--json]`: exit 0 verified, 1 rejected, 2 bad input."""
    ap = subparsers.add_parser(
        "verify",
        help="verify a checkpoint (integrity, NaN/Inf, exploded tensors, arch)",
        description="Verify a checkpoint: exit 0 verified, 1 rejected, 2 bad input. A file is verified here; "
        "a run's `latest` through its keeper while the keeper is up (journaled, its warm verifier), "
        "here once it is gone.",
    )
    _configure(ap)
    ap.set_defaults(func=run_verify)


_CKPT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".tar")


def _file_in(path: Path) -> Path:
    """The checkpoint a directory stands for: a step directory's file, a root's `latest`."""
    manifest = path / "manifest.json"
    if manifest.is_file():
        try:
            name = json.loads(manifest.read_text()).get("file")
        except (OSError, ValueError) as exc:
            raise _BadInput(f"{manifest}: unreadable manifest: {exc}") from None
        if name and (path / str(name)).is_file():
            return path / str(name)
        raise _BadInput(f"{path}: the manifest names no file that is there")
    if (path / layout.LATEST).exists() or (path / layout.QUARANTINE).is_dir():
        latest = layout.latest_checkpoint(path)
        if latest is None:
            raise _BadInput(f"{path}: no verified checkpoint (`latest` points nowhere)")
        return latest
    raise _BadInput(f"{path}: a directory that is neither a step directory nor a checkpoint root")


def _run_target(spec: str | None) -> tuple[Any, Path]:
    """(RunInfo, its checkpoint root) for a run spec (None: the newest run)."""
    try:
        info = runs.resolve_run(spec)
        rec = runs.read_record(Path(info.run_dir))
    except runs.RunError as exc:
        raise _BadInput(str(exc)) from None
    return info, Path(str(rec.options.get("ckpt_root") or Path(info.run_dir) / "checkpoints"))


def _via_keeper(info: Any, expected: dict[str, Any] | None) -> dict[str, Any] | None:
    """The keeper's `verify` action on its `latest` (journaled); None when the keeper is gone."""
    args: dict[str, Any] = {"expected": expected} if expected else {}
    try:
        reply = KeeperClient(info.sock).call("verify", args, confirm=True)
    except KeeperGone:
        return None
    if not reply.after:
        raise _BadInput(f"run {info.run_id}: {reply.message}")
    return dict(reply.after)


def run_verify(args: argparse.Namespace) -> int:
    try:
        expected = _parse_expected(args.expect_json)
        rep = _verify_target(args, expected)
    except _BadInput as exc:
        print(f"trainroom verify: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        print(f"trainroom verify: needs torch in this environment ({exc})", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(verifier._clean(rep), allow_nan=False) + "\n")
    else:
        print(_human(rep))
    return 0 if rep.get("ok") else 1


def _verify_target(args: argparse.Namespace, expected: dict[str, Any] | None) -> dict[str, Any]:
    target = args.path
    path = Path(target) if target else None
    if path is not None and path.is_file():
        file = path
    elif path is not None and path.is_dir():
        if (path / "run.msgpack").is_file():
            return _verify_run(str(path), expected, args)
        file = _file_in(path)
    elif path is not None and (os.sep in str(target) or str(target).endswith(_CKPT_SUFFIXES)):
        raise _BadInput(f"{path}: {'not a file' if path.exists() else 'no such file'}")
    else:
        return _verify_run(target, expected, args)
    if getattr(args, "nice", 0):
        with contextlib.suppress(OSError):
            os.nice(args.nice)
    return verifier.verify(file, expected, discover=not args.no_discover)


def _verify_run(
    spec: str | None, expected: dict[str, Any] | None, args: argparse.Namespace
) -> dict[str, Any]:
    info, root = _run_target(spec)
    if info.alive:
        rep = _via_keeper(info, expected)
        if rep is not None:
            return rep
    latest = layout.latest_checkpoint(root) if root.is_dir() else None
    if latest is None:
        raise _BadInput(f"run {info.run_id}: no verified checkpoint under {root} (`latest` points nowhere)")
    return verifier.verify(latest, expected, discover=not args.no_discover)


# --------------------------------------------------------------------------- prune


def _add_prune(subparsers: Any) -> None:
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


def _run_root(info: Any) -> tuple[Path, int | None]:
    rec = runs.read_record(Path(info.run_dir))
    keep = rec.options.get("keep") if isinstance(rec.options.get("keep"), int) else None
    return Path(str(rec.options.get("ckpt_root") or Path(info.run_dir) / "checkpoints")), keep


def _live_owner(root: Path) -> Any:
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


def _target(args: argparse.Namespace) -> tuple[Path, Any, int | None]:
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


def _records(items: Any) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(x) if not isinstance(x, dict) else x for x in items]


def _through_keeper(args: argparse.Namespace, info: Any, keep: int | None) -> dict[str, Any]:
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
    pl = pruning.plan(root, keep, include_rejected=args.include_rejected)
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
    res = pruning.execute(pl, dry_run=args.dry_run)
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


def run_prune(args: argparse.Namespace) -> int:
    """Through the run's live keeper, else on the files: the same plan, the same output."""
    try:
        if args.keep is not None and args.keep < 0:
            raise _BadInput("--keep must be 0 or more")
        root, live, run_keep = _target(args)
        if live is not None:
            out = _through_keeper(args, live, args.keep)
        else:
            out = _on_files(
                args, root, args.keep if args.keep is not None else run_keep or pruning.DEFAULT_KEEP
            )
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

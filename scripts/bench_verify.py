"""Verify a ~400 MB checkpoint against `sha256sum` of the same file, in one run.

    python scripts/bench_verify.py [--mb 400] [--repeat 3] [--keep PATH]
    python scripts/bench_verify.py --first-verdict [--trials 3] [--save-after 30] [--mb 40] [--busy 2]

Writes a GPT-shaped float32 checkpoint with the SDK (so the save-time digest is recorded), warms
the page cache with one read, then times, best of --repeat:
  sha256sum FILE               (coreutils, the baseline)
  digest (xxh3-128)            what the verifier hashes with; blake3 shown for the record
  verify, in-process           digest + torch.load(mmap) + NaN/Inf + std of every tensor + arch
  warm verifier                the keeper's path: the same in its one child with torch imported,
                               reused across checkpoints (first call: the child's start too)
  verify_in_subprocess         the one-shot path: starting Python and importing torch each time
Prints GB/s and the ratio to sha256sum for each. The goal is >= 3x sha256sum for the verifier,
in-process and on the keeper's path.

--first-verdict measures instead, through real keepers, how long after a save its first verdict
comes: the verifier warm from launch against the cold start it replaces, on this machine idle
and with --busy CPU loops running (scripts/bench_first_verdict.py).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def best_of(n: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=400.0, help="checkpoint size in MB (default 400)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="write the checkpoint root here and keep it")
    ap.add_argument(
        "--first-verdict", action="store_true", help="the first verdict after a save, cold vs warm"
    )
    ap.add_argument("--trials", type=int, default=3, help="--first-verdict: trials per case")
    ap.add_argument("--save-after", type=float, default=30.0, help="--first-verdict: seconds before the save")
    ap.add_argument("--busy", type=int, default=2, help="--first-verdict: busy CPU loops for the loaded case")
    ap.add_argument(
        "--timeout", type=float, default=300.0, help="--first-verdict: seconds to wait per verdict"
    )
    args = ap.parse_args()
    if args.first_verdict:
        sys.path.insert(0, str(Path(__file__).parent))
        import bench_first_verdict

        mb = args.mb if "--mb" in sys.argv else 40.0
        return bench_first_verdict.run(args.trials, args.save_after, mb, args.busy, args.timeout)
    if args.mb <= 0 or args.repeat < 1:
        print("bench_verify: --mb and --repeat must be positive", file=sys.stderr)
        return 2
    if shutil.which("sha256sum") is None:
        print("bench_verify: sha256sum not found", file=sys.stderr)
        return 2

    import torch

    from trainroom.core.ckpt import verify as v
    from trainroom.core.ckpt.digest import digest_file
    from trainroom.core.ckpt.report import VerifyReport
    from trainroom.core.ckpt.verifier import WarmVerifier, verify_in_subprocess
    from trainroom.core.sdk import save as save

    tmp = Path(tempfile.mkdtemp(prefix="trbench"))
    root = args.keep or tmp / "ck"
    try:
        # GPT-2 small's layout (d_model 768, vocab 50304, wte tied to lm_head) with as many blocks
        # as the size asks for; a narrower model for small sizes.
        target = args.mb * 1e6 / 4
        d = 768 if args.mb >= 100 else 128
        vocab = 50304 if target > 2 * 50304 * d else max(256, int(target / 2 / d))
        blocks = max(1, round((target - vocab * d) / (12 * d * d)))
        g = torch.Generator().manual_seed(0)
        sd: dict[str, torch.Tensor] = {"transformer.wte.weight": torch.randn(vocab, d, generator=g) * 0.02}
        for i in range(blocks):
            for name, shape in (
                ("ln_1.weight", (d,)),
                ("attn.c_attn.weight", (3 * d, d)),
                ("attn.c_proj.weight", (d, d)),
                ("mlp.c_fc.weight", (4 * d, d)),
                ("mlp.c_proj.weight", (d, 4 * d)),
            ):
                sd[f"transformer.h.{i}.{name}"] = torch.randn(*shape, generator=g) * 0.02
        sd["lm_head.weight"] = sd["transformer.wte.weight"]
        t = time.perf_counter()
        saved = save.save_checkpoint({"model": sd, "iter_num": 1}, 1, root=root, promote_inline=False)
        save_s = time.perf_counter() - t
        del sd  # the verifier reads the file, not these
        path = Path(saved.path)
        size = path.stat().st_size
        gb = size / 1e9
        path.read_bytes()  # warm the page cache: every figure below reads from memory, like sha256sum's

        sha = best_of(
            args.repeat,
            lambda: subprocess.run(["sha256sum", str(path)], check=True, stdout=subprocess.DEVNULL),
        )
        xxh = best_of(args.repeat, lambda: digest_file(path))

        def openssl_sha256() -> None:
            import hashlib

            with open(path, "rb") as f:
                hashlib.file_digest(f, "sha256")

        # coreutils' sha256sum may not use the CPU's SHA extensions; OpenSSL's (hashlib) does.
        ossl = best_of(args.repeat, openssl_sha256)
        try:
            import blake3

            def b3() -> None:
                h = blake3.blake3(max_threads=blake3.blake3.AUTO)
                h.update_mmap(str(path))
                h.hexdigest()

            b3_s: float | None = best_of(args.repeat, b3)
        except ImportError:
            b3_s = None
        reports: list[VerifyReport] = []
        t = time.perf_counter()
        reports.append(v.verify(path))
        first = time.perf_counter() - t  # the first mmap load faults every page in
        inproc = min(first, best_of(max(1, args.repeat - 1), lambda: reports.append(v.verify(path))))
        rep = reports[-1]
        if not rep.ok or not rep.digest_ok:
            print(f"bench_verify: the checkpoint did not verify: {rep.reason}", file=sys.stderr)
            return 1
        sub = best_of(max(1, args.repeat - 1), lambda: verify_in_subprocess(path, timeout=600))
        warm = WarmVerifier(nice=0)
        try:
            t = time.perf_counter()
            warm_rep = warm.verify(path, timeout=600)
            warm_first = time.perf_counter() - t
            warm_best = best_of(args.repeat, lambda: warm.verify(path, timeout=600))
            if warm.starts != 1 or not warm_rep.ok:
                print(
                    f"bench_verify: the warm verifier restarted or rejected: {warm_rep.reason}",
                    file=sys.stderr,
                )
                return 1
        finally:
            warm.close()

        def row(name: str, s: float) -> str:
            return f"  {name:44s} {s:8.3f} s  {gb / s:7.2f} GB/s  {sha / s:6.2f}x sha256sum"

        print(
            f"bench_verify: {size / 1e6:.0f} MB checkpoint, {rep.tensors} tensors, {rep.params:,} params "
            f"(saved in {save_s:.2f} s, {gb / save_s:.2f} GB/s with the digest taken while writing); "
            f"page cache warm, best of {args.repeat}, torch threads {torch.get_num_threads()}"
        )
        print(row("sha256sum", sha))
        print(row("sha256 via OpenSSL (hashlib)", ossl))
        print(row("digest xxh3-128 (the verifier's)", xxh))
        if b3_s is not None:
            print(row("digest blake3 (all cores, mmap)", b3_s))
        print(row("verify, in-process (first run)", first))
        print(row("verify, in-process (best)", inproc))
        print(row("warm verifier, the keeper's (first: +start)", warm_first))
        print(row("warm verifier, the keeper's (reused)", warm_best))
        print(row("verify_in_subprocess (+ torch import)", sub))
        for name, s in (("in-process, first run", first), ("keeper's warm verifier", warm_best)):
            print(
                f"  goal >= 3x sha256sum for the verifier ({name}): {'met' if sha / s >= 3.0 else 'NOT met'} "
                f"({sha / s:.2f}x)"
            )
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

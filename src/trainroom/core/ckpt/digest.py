"""The checkpoint digest: xxh3-128 of the file's bytes, written `xxh3-128:<hex>`.

xxh3-128 measured here at 22.8 GB/s on one core, blake3 at 6.9 (12.8 on both cores), sha256 1.75.
The digest guards against corruption, not an adversary, so the fastest good hash wins. The SDK
takes it while torch.save writes; the verifier takes it again from the disk.
"""

from __future__ import annotations

import os

import xxhash

DIGEST_ALGO = "xxh3-128"
READ_CHUNK = 8 << 20

Hasher = xxhash.xxh3_128


def new_hasher() -> Hasher:
    return xxhash.xxh3_128()


def digest_hex(hasher: Hasher) -> str:
    return f"{DIGEST_ALGO}:{hasher.hexdigest()}"


def digest_file(path: str | os.PathLike[str]) -> str:
    h = new_hasher()
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return digest_hex(h)

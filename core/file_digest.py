"""Content hashes of files: a checkpoint counts by what it holds, not by its name."""
from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """The sha256 of ``path``'s bytes, hex."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()

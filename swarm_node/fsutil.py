"""Crash-safe file writes: write a temporary file beside the target, fsync, rename over it.

A reader (another process, or this one after a kill -9) sees either the old content or the new,
never a torn file. Used for checkpoint metadata, the status file and cached warm starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: str | Path) -> None:
    """Make a rename inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, durable: bool = True) -> None:
    """Replace `path` with `data` atomically; `durable` also fsyncs file and directory."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    raw = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_json_atomic(path: str | Path, obj: Any, durable: bool = True) -> None:
    """`write_atomic` of `obj` as indented JSON."""
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n", durable)

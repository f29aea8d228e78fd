"""Atomic checkpoints: a crash (even kill -9) mid-write never damages the previous checkpoint.

Layout under `OUT/checkpoints/`:
    round-000007/      one complete checkpoint (after round 7 finished)
        model/         `save_pretrained` output: full weights, or only the LoRA adapter
        optimizer.pt   optimizer state
        rng.pt         torch / python RNG states (sampling itself is seeded per round)
        guard.pt       the swarm guard's state, if it runs (train/guard.py; `extras`)
        state.json     {"round": 7, "policy_version": ..., ...}  (written last)
        config.yaml    the resolved run config
    latest             the name of the newest complete checkpoint (replaced atomically)

A checkpoint is written into a temporary sibling directory, flushed to disk, then renamed into
place; only then is `latest` replaced (write temp file + os.replace). Readers trust only
directories that `latest` names or that contain `state.json`, so a torn write is invisible.
Directories are never deleted in place: an old checkpoint (or one being replaced) is first
renamed to `.trash-*`, so no `round-*` directory is ever half-deleted either. Leftovers of a
killed writer (`.tmp-*`, `.trash-*`) are removed by the next save. tests/test_reliability.py
SIGKILLs writers at random moments and loads the survivor every time.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path

import torch

from swarm_node.config import NodeConfig
from swarm_node.errors import SwarmNodeError
from swarm_node.fsutil import write_atomic
from swarm_node.train.policy import Policy

log = logging.getLogger(__name__)
KEEP = 2  # complete checkpoints kept on disk


class CheckpointError(SwarmNodeError):
    """A checkpoint could not be written or read (disk full, unwritable directory, corrupt files)."""


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*")) + [path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _discard(root: Path, path: Path) -> None:
    """Delete a checkpoint directory without ever leaving a half-deleted `round-*` behind."""
    trash = root / f".trash-{path.name}-{os.getpid()}"
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _why(error: Exception, root: Path, written: int) -> str:
    """What went wrong, in words: torch.save's RuntimeError on a full disk says only "unexpected
    pos 159808 vs 159700", so a disk with less room left than was written is named as full."""
    reason = getattr(error, "strerror", None) or str(error)
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        return reason
    if not getattr(error, "strerror", None) and free <= written + (1 << 20):
        return f"No space left on device ({free} bytes free after writing {written}; {reason})"
    return reason


def _remove_leftovers(root: Path) -> None:
    """Temp and trash entries of writers that were killed (one node writes one output dir)."""
    for p in root.glob(".*"):
        if p.name.startswith((".tmp-", ".trash-", ".latest.tmp-")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def save_checkpoint(out: str | Path, policy: Policy, optimizer: torch.optim.Optimizer, state: dict,
                    cfg: NodeConfig, extras: dict[str, dict] | None = None) -> Path:
    """Write checkpoint `round-{state['round']:06d}` atomically; returns its directory. `extras`: more
    states by name, each saved as `<name>.pt` (tensors and plain values; `load_extra` reads one)."""
    root = Path(out) / "checkpoints"
    name = f"round-{state['round']:06d}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(root)
        tmp.mkdir()
        policy.save(tmp / "model")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
        for extra, value in (extras or {}).items():
            torch.save(value, tmp / f"{extra}.pt")
        cfg.save(tmp / "config.yaml")
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        _fsync_tree(tmp)
        final = root / name
        if final.exists():  # re-saving a round (e.g. after a resume): the old copy goes to the trash
            _discard(root, final)
        os.rename(tmp, final)
        write_atomic(root / "latest", name)
    except Exception as e:  # OSError, torch's RuntimeError, safetensors' SafetensorError: disk full, unwritable...
        written = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.is_dir() else 0
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint under {root}: {_why(e, root, written)}") from e
    for old in sorted(p for p in root.glob("round-*") if p.name != name)[:-(KEEP - 1) or None]:
        try:
            _discard(root, old)
        except OSError:
            log.warning("could not remove old checkpoint %s", old)
    return final


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint under `out`, or None."""
    root = Path(out) / "checkpoints"
    pointer = root / "latest"
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if name.startswith("round-") and "/" not in name and (root / name / "state.json").exists():
        return root / name
    complete = sorted(p for p in root.glob("round-*") if (p / "state.json").exists())
    return complete[-1] if complete else None


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer) -> dict:
    """Restore optimizer and RNG states from checkpoint `path`; returns its state dict.

    The model weights are loaded by the caller (`Policy.load` from `path / "model"`), because a
    LoRA checkpoint needs the base model first.
    """
    try:
        state = json.loads((path / "state.json").read_text())
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        rng = torch.load(path / "rng.pt", weights_only=True)  # never unpickle code: checkpoints get copied around
    except Exception as e:  # OSError, pickle/zip errors, EOFError, bad JSON: all mean a damaged checkpoint
        raise CheckpointError(f"checkpoint {path} is unreadable: {e}") from None
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return state


def load_extra(path: Path, name: str) -> dict | None:
    """The state saved as `extras[name]` with checkpoint `path`, or None if it has none (an older checkpoint)."""
    file = path / f"{name}.pt"
    if not file.exists():
        return None
    try:
        return torch.load(file, weights_only=True)
    except Exception as e:  # OSError, pickle/zip errors, EOFError: a damaged checkpoint
        raise CheckpointError(f"checkpoint {path} is unreadable: {name}.pt: {e}") from None

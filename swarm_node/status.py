"""The node's machine-readable status: `OUT/status.json`, replaced atomically as the node runs.

Programs that watch a node (the demo's live view, the tests, the docker entrypoint, monitoring)
read this file instead of parsing log lines. Fields (all present, `null` until known):

    schema          1 (incremented when a field changes meaning)
    node            display name (config `name`)
    pid             the node's process id
    state           starting | warmstart | running | finished | stopped (Ctrl-C) | failed
    peer_id         libp2p peer id (swarm nodes), null when training alone
    join_addrs      full multiaddrs others can pass to `--peers`, relayed first, loopback last
    reachability    the start-up reachability line ("reachable at ...", "behind NAT: serving through relay ...")
    round           last finished round (-1 before round 0 finished)
    rounds          last round of the run (config train.rounds)
    policy_version  optimizer steps taken
    model           model name or path (config model.name)
    params          parameters of the model, trainable_params those the optimizer updates
    warmstart       {"step", "steps", "loss"} while the supervised warm start runs, else null
    error           one-line reason when state is failed, else null
    updated_at      unix time of this write
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from swarm_node.fsutil import write_json_atomic

SCHEMA = 1
FILENAME = "status.json"


@dataclass
class Status:
    node: str
    rounds: int
    pid: int = field(default_factory=os.getpid)
    schema: int = SCHEMA
    state: str = "starting"
    peer_id: str | None = None
    join_addrs: list[str] = field(default_factory=list)
    reachability: str | None = None
    round: int = -1
    policy_version: int = 0
    model: str | None = None
    params: int | None = None
    trainable_params: int | None = None
    warmstart: dict | None = None
    neighbours: dict | None = None  # a swarm node's neighbours as it measured them: outbound, credits, rounds_idle, rounds_useless
    error: str | None = None
    updated_at: float = 0.0


class StatusFile:
    """Owns OUT/status.json: `update(**fields)` changes fields and rewrites the file atomically."""

    def __init__(self, out: str | Path, node: str, rounds: int):
        self.path = Path(out) / FILENAME
        self.status = Status(node=node, rounds=rounds)
        self.update()

    def update(self, **fields) -> None:
        for key, value in fields.items():
            if not hasattr(self.status, key):
                raise AttributeError(f"status has no field {key!r}")
            setattr(self.status, key, value)
        self.status.updated_at = time.time()
        try:  # not durable: it changes every round, and a stale status after a crash is harmless
            write_json_atomic(self.path, asdict(self.status), durable=False)
        except OSError:  # a full disk must not stop training; metrics and checkpoints report it
            pass


def read_status(out: str | Path) -> dict | None:
    """The last status a node wrote in `out`, or None if there is none (yet) or it is unreadable."""
    try:
        return json.loads((Path(out) / FILENAME).read_text())
    except (OSError, ValueError):
        return None


def wait_for_status(out: str | Path, ready, timeout: float, poll_s: float = 0.2, alive=lambda: True) -> dict:
    """Poll `out`'s status until `ready(status)` holds; raises TimeoutError (or RuntimeError if
    `alive()` turns false, e.g. the node process exited) with the last status seen."""
    deadline, status = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        status = read_status(out)
        if status is not None and ready(status):
            return status
        if not alive():
            raise RuntimeError(f"node stopped before its status was ready (last status: {status})")
        time.sleep(poll_s)
    raise TimeoutError(f"status in {out} not ready after {timeout:.0f} s (last status: {status})")

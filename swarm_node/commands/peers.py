"""`swarm-node peers`: join a swarm as a light client (no model, no training) and list its peers.

A volunteer's first question is "is anyone there?". The light client starts a transport that
offers nothing, listens for `wait` seconds, and reports what each peer announced: model,
tokenizer fingerprint, protocol version, current round and policy version, and how old its
newest offer is. The list is the swarm as this client sees it (with push discovery, the peers
that announced to it), not a census.

`--scores OUT` answers the second question, "whom does my node keep, and why?": it reads the
`neighbours` a running node writes to OUT/status.json each round (what the node measured of each:
whether it dialled it, packets it took from it, rounds since the last one and since the last one
that could teach, and the address its connection came from), without joining anything.
"""

from __future__ import annotations

import time
from pathlib import Path

from swarm_node.config import SwarmConfig
from swarm_node.errors import SwarmNodeError
from swarm_node.net import PeerInfo
from swarm_node.status import read_status

LIGHT_CLIENT_MODEL = "swarm-node-peers"  # how the light client names itself in its own announcement
NO_TOKENIZER = "sha256:" + "0" * 64  # a well-formed fingerprint that no tokenizer has (it trains on nothing)


def reach(info: PeerInfo) -> str:
    """How the peer is reached: "relay" if its first announced address is a circuit (it is behind
    NAT), "direct" if it announced others, "?" if it announced none."""
    if not info.addrs:
        return "?"
    return "relay" if "/p2p-circuit" in info.addrs[0] else "direct"


def describe(info: PeerInfo, now: float) -> dict:
    """One peer as a flat JSON-able dict."""
    return {"peer_id": info.peer_id, "model": info.model_id, "tokenizer": info.tokenizer,
            "protocol": info.protocol, "round": info.round, "policy_version": info.policy_version,
            "offers": len(info.offers), "reach": reach(info), "last_seen_s": round(max(0.0, now - info.updated_at), 1)}


MIN_LISTEN_S = 10.0  # listen at least this long (or wait_s): peers behind a relay are dialled only after the
# relay's peer exchange names them (under load a listing that stopped after 3 stable seconds showed only the relay)


def list_peers(cfg: SwarmConfig, wait_s: float, poll_s: float = 1.0) -> list[dict]:
    """The peers seen within `wait_s` seconds (returns early once the set has been stable for a few
    polls, after MIN_LISTEN_S)."""
    from swarm_node.net.hivemind import HivemindTransport

    transport = HivemindTransport(cfg, LIGHT_CLIENT_MODEL, NO_TOKENIZER, produces=False)
    transport.start()
    try:
        seen: dict[str, PeerInfo] = {}
        start, stable = time.monotonic(), 0
        deadline = start + wait_s
        while time.monotonic() < deadline:
            before = len(seen)
            for info in transport.peers():
                if info.model_id != LIGHT_CLIENT_MODEL:
                    seen[info.peer_id] = info
            stable = stable + 1 if seen and len(seen) == before else 0
            if stable >= 3 and time.monotonic() >= start + min(wait_s, MIN_LISTEN_S):
                break
            time.sleep(poll_s)
    finally:
        transport.close()
    now = time.time()
    return [describe(info, now) for info in sorted(seen.values(), key=lambda p: p.peer_id)]


def neighbour_scores(out: str) -> tuple[dict, list[dict]]:
    """(the node's status, its neighbours as it measured them, most packets first) from OUT/status.json."""
    status = read_status(out)
    if status is None:
        raise SwarmNodeError(f"no node status in {out}/status.json: pass the --out directory of a running swarm node")
    rows = [{"peer_id": p, **s} for p, s in (status.get("neighbours") or {}).items()]
    return status, sorted(rows, key=lambda r: (-r.get("credits", 0), r["peer_id"]))


def render_scores(status: dict, rows: list[dict]) -> str:
    """A table for people: one line per neighbour of the node."""
    state = f"node {status.get('node')!r} ({status.get('state')}, round {status.get('round')})"
    if not rows:
        return f"{state}: no neighbours yet"
    head = f"{'peer id':<52} {'dialled':>7} {'packets':>7} {'idle':>4} {'useless':>7} {'offers':>6}  address"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['peer_id']:<52} {'out' if r.get('outbound') else 'in':>7} {r.get('credits', 0):>7} "
                     f"{r.get('rounds_idle', 0):>4} {r.get('rounds_useless', 0):>7} "
                     f"{'yes' if r.get('offers') else 'no':>6}  {r.get('addr') or '?'}")
    lines.append(f"{len(rows)} neighbour(s) of {state}; idle/useless: rounds since its last packet taken / "
                 "since its last one that could teach (mixed rewards); offers: announces a packet it serves, as far as we know")
    return "\n".join(lines)


def printable(text: str) -> str:
    """`text` with every non-printable character (escape sequences, newlines) shown as `?`: peer-chosen
    strings that moved the cursor and erased an honest peer's row from the table (red team 12)."""
    return "".join(c if c.isprintable() else "?" for c in str(text))


def render(rows: list[dict], run_id: str) -> str:
    """A table for people: one line per peer."""
    if not rows:
        return f"no peers of run {run_id!r} answered (check --peers and --run-id)"
    head = (f"{'peer id':<52} {'model':<20} {'tokenizer':<14} {'proto':>5} {'round':>6} {'version':>7} "
            f"{'reach':>6} {'last seen':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        model = Path(r["model"]).name if r["model"].startswith(("/", ".", "~")) else r["model"]  # a local path
        model, tokenizer = printable(model), printable(r["tokenizer"])  # a peer's claims, never terminal controls
        lines.append(f"{r['peer_id']:<52} {model[:20]:<20} {tokenizer[:14]:<14} {r['protocol']:>5} "
                     f"{r['round']:>6} {r['policy_version']:>7} {r['reach']:>6} {r['last_seen_s']:>8.1f}s")
    lines.append(f"{len(rows)} peer(s) of run {run_id!r}")
    return "\n".join(lines)

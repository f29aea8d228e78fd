"""Discovery at scale, by message counts (not wall clock): v1 (one DHT key) vs v2 (push mesh), N = 10 .. 10,000.

v2 is simulated with the real `swarm_node.net.announce.Mesh` of every node: announcements are real
msgpack frames (their sizes are measured), exchanges are function calls, on a virtual clock with
one round every --round-s seconds. Nodes join one at a time through the same initial peer (node 0:
everyone copied the same `--peers` line, the worst case for node 0), then run --rounds rounds in
which every node offers a packet, pushes its announcement to its neighbors, keeps its mesh
(prune, dial candidates while short) and fetches min(k, neighbors) packets. The DHT part of v2
(membership records) and all of v1 are counted from their protocol, not simulated. v2 is measured
over --rounds rounds after --warmup rounds in which the mesh settles (links pruned, short nodes
refilled); the join itself is reported apart (its load on node 0).

  v1 (dht-key)  per round a node stores its record (a DHT store: find RPCs to min(N-1, 20 + log2 N)
                nodes + 5 store RPCs) and polls the run's key --polls times (measured: one poll per
                0.25 s of waiting). `get(latest=True)` never stops early: each poll visits the same
                nodes, and each returns all N records (R bytes each): hivemind caches a found value
                on the nodes along the path (bench/scale.py at N = 16: ~11 of the 15 nodes a poll
                visits returned the whole value). Those ~20 nodes nearest to the key answer every
                poll of every node. A lookup fails once N x R exceeds p2pd's 4 MiB message.
  v2 membership a node stores its membership record every 100 s with probability
                min(1, 256 / 3N) (so ~256 live records whatever N), a store as above; the 5 holders
                of each of the 8 bucket keys receive those stores and their traversals' find RPCs.

    .venv/bin/python bench/discovery_sim.py                 # N = 10 100 1000 10000 (~1 min)
    .venv/bin/python bench/discovery_sim.py --nodes 10 100  # quick
"""
from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import base58

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402
from swarm_node.net.announce import Mesh
from swarm_node.net.scores import MeshParams
from swarm_node.net.records import frame_size
from swarm_node.net.records import MEMBER_BUCKETS

RUN = "sim"
V1_RECORD_BYTES = 1100  # one v1 record as a dictionary entry: msgpack record with 4 offers + signature + owner subkey
FIND_REQ, FIND_RESP = 80, 1300  # bytes of a hivemind find request / response listing 20 peers (no value)
STORE_REQ_V1, STORE_REQ_V2, STORE_RESP = 1300, 900, 40
REPLICAS, BEAM, P2PD_MAX_MSG = 5, 20, 4 * 2**20
MEMBER_INTERVAL_S = 100.0  # v2 membership refresh: TTL 300 s (5 x record_ttl_s), every TTL / 3


def peer_id(i: int) -> str:
    return base58.b58encode(b"\x12\x20" + hashlib.sha256(b"sim %d" % i).digest()).decode()


def traversal(n: int) -> int:
    """Find RPCs of one hivemind DHT traversal (beam search, beam = bucket size 20)."""
    return min(n - 1, BEAM + math.ceil(math.log2(max(2, n / BEAM))))


# ---------------------------------------------------------------------------------------------- v1
def v1_model(n: int, polls: int) -> dict:
    store_msgs = 2 * (traversal(n) + REPLICAS)
    store_bytes = traversal(n) * (FIND_REQ + FIND_RESP) + REPLICAS * (STORE_REQ_V1 + STORE_RESP)
    value = n * V1_RECORD_BYTES
    poll_msgs = 2 * traversal(n)
    poll_bytes = traversal(n) * (FIND_REQ + FIND_RESP + value)  # every visited node returns its (cached) copy
    busiest_msgs = 2 * n * polls + 2 * n  # a key holder: every node's polls and stores
    busiest_bytes = n * polls * (FIND_REQ + value) + n * STORE_REQ_V1
    return {"n": n, "design": "dht-key", "msgs": store_msgs + polls * poll_msgs, "bytes": store_bytes + polls * poll_bytes,
            "busiest_msgs": busiest_msgs, "busiest_bytes": busiest_bytes, "degree": None, "uploads_max": None,
            "fails": value > P2PD_MAX_MSG, "value_bytes": value}


# ---------------------------------------------------------------------------------------------- v2
class Sim:
    """Every node's Mesh, exchanges as function calls, per-node frame and byte counters."""

    def __init__(self, n: int, k: int, round_s: float, seed: int):
        self.n, self.k, self.round_s, self.now = n, k, round_s, 0.0
        self.rng = random.Random(seed)
        self.ids = [peer_id(i) for i in range(n)]
        self.addrs = {p: [f"/ip4/10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}/tcp/31337"] for i, p in enumerate(self.ids)}
        self.params = MeshParams.for_peers(k, 60.0, 16 * 2**20)
        self.meshes: dict[str, Mesh] = {}
        self.frames, self.bytes, self.uploads = Counter(), Counter(), Counter()
        self.member_reads = 0
        self.writers: list[str] = []  # nodes with a live membership record

    def exchange(self, src: str, dst: str) -> None:
        a, b = self.meshes[src], self.meshes[dst]
        request = a.announcement(to=dst)
        reply = b.receive(src, request, self.now)
        a.on_reply(dst, reply, self.now)
        up, down = frame_size(request), frame_size(reply)
        for node in (src, dst):
            self.frames[node] += 2
            self.bytes[node] += up + down

    def fill(self, node: str) -> None:
        mesh = self.meshes[node]
        mesh.prune(self.now)
        mesh.evict(self.now)
        tried = 0
        while mesh.short() and tried < 4 * self.params.degree:
            found = mesh.candidates(1, self.now)
            if not found:
                if not self.writers:
                    break
                self.member_reads += 1  # a membership read: one traversal that stops at the first holder
                self.frames[node] += 2 * math.ceil(math.log2(max(2, self.n)))
                mesh.learn([(p, self.addrs[p]) for p in self.rng.sample(self.writers, min(16, len(self.writers)))])
                found = mesh.candidates(1, self.now)
                if not found:
                    break
            self.exchange(node, found[0][0])
            tried += 1

    def join_all(self) -> dict:
        first = self.ids[0]
        for i, node in enumerate(self.ids):
            self.meshes[node] = Mesh(node, RUN, 1, self.params, {} if i == 0 else {first: self.addrs[first]}, self.rng)
            self.meshes[node].set_own("m", "t", 0, 0, [], self.addrs[node])
            if self.rng.random() < min(1.0, 256 / (3 * self.n)):
                self.writers.append(node)
            self.fill(node)
        joined = {"node0_frames": self.frames[first], "frames_per_node": sum(self.frames.values()) / self.n,
                  "member_reads": self.member_reads}
        self.frames.clear()
        self.bytes.clear()
        return joined

    def round(self, r: int) -> None:
        self.now = r * self.round_s
        order = self.ids[:]
        self.rng.shuffle(order)
        for node in order:
            offers = [(q, hashlib.sha256(b"%s %d" % (node.encode(), q)).hexdigest(), 42_567) for q in range(max(1, r - 3), r + 1)]
            self.meshes[node].set_own("bench/synthetic", "sha256:" + "ab" * 32, r, r,
                                      [(q, "sha256:" + d, s) for q, d, s in offers], self.addrs[node])
            for peer in list(self.meshes[node].neighbors):
                self.exchange(node, peer)
        for node in order:
            self.fill(node)
            neighbors = list(self.meshes[node].neighbors)
            for peer in neighbors:  # every honest neighbour's packet arrives (fair arrival) and is accepted
                self.meshes[node].credit(peer, self.now)
            for peer in self.rng.sample(neighbors, min(self.k, len(neighbors))):
                self.uploads[peer] += 1  # fetches are the payload path: counted apart, not as discovery


def v2_sim(n: int, k: int, rounds: int, round_s: float, seed: int, warmup: int) -> dict:
    sim = Sim(n, k, round_s, seed)
    t = time.time()
    joined = sim.join_all()
    for r in range(1, warmup + rounds + 1):
        if r == warmup + 1:  # the mesh has settled after the join's churn (links pruned, short nodes refilled)
            sim.frames.clear(), sim.bytes.clear(), sim.uploads.clear()
        sim.round(r)
    degrees = [len(m.neighbors) for m in sim.meshes.values()]
    writes = min(n, 256 / 3) * round_s / MEMBER_INTERVAL_S  # membership stores in the whole swarm per round
    dht_msgs = writes / n * 2 * (traversal(n) + REPLICAS)  # per node per round, amortized
    dht_bytes = writes / n * (traversal(n) * (FIND_REQ + FIND_RESP) + REPLICAS * (STORE_REQ_V2 + STORE_RESP))
    holder_msgs = writes / MEMBER_BUCKETS * 2 * 2  # each bucket's holders: its stores + their traversals' finds
    holder_bytes = writes / MEMBER_BUCKETS * (STORE_REQ_V2 + STORE_RESP + FIND_REQ + FIND_RESP)
    frames = [sim.frames[p] / rounds for p in sim.ids]
    sizes = [sim.bytes[p] / rounds for p in sim.ids]
    busiest = max(sim.ids, key=lambda p: sim.frames[p])
    return {"n": n, "design": "push", "msgs": sum(frames) / n + dht_msgs, "bytes": sum(sizes) / n + dht_bytes,
            # the busiest mesh node, as if it also held a membership key (an upper bound)
            "busiest_msgs": sim.frames[busiest] / rounds + dht_msgs + holder_msgs,
            "busiest_bytes": sim.bytes[busiest] / rounds + dht_bytes + holder_bytes,
            "degree": sum(degrees) / n, "degree_min": min(degrees), "degree_max": max(degrees),
            "uploads_max": max(sim.uploads.values()) / rounds if sim.uploads else 0, "fails": False,
            "join": joined, "dht_msgs_per_node": dht_msgs, "holder_msgs": holder_msgs, "sim_s": time.time() - t}


COLUMNS = ["N", "design", "msgs/node", "KB/node", "busiest msgs", "busiest KB", "neighbors", "max uploads", "note"]
CAPTION = ("per round. msgs = messages a node sends + receives to discover offers (DHT RPC requests and responses, "
           "announcement frames; packet fetches not included); busiest = the node with the most (v2: the busiest mesh "
           "node, counted as if it also held a membership key); max uploads = most packets one node served in a round")


def table_rows(results: list[dict]) -> list[list]:
    rows = []
    for r in results:
        fails = " (lookups fail: value > 4 MiB)" if r["fails"] else ""
        note = (f"key value {r['value_bytes'] / 2**20:.2f} MiB" if r["design"] == "dht-key" else
                f"degree {r['degree_min']}-{r['degree_max']}; the join: node 0 {r['join']['node0_frames']:,} msgs once")
        rows.append([r["n"], r["design"], r["msgs"], r["bytes"] / 1e3, r["busiest_msgs"], r["busiest_bytes"] / 1e3,
                     r["degree"] if r["degree"] is not None else "-", r["uploads_max"] if r["uploads_max"] is not None else "-",
                     note + fails])
    return rows


def title(a: dict) -> str:
    return (f"k = {a['k']}, a round every {a['round_s']:g} s, v1 polling {a['polls']}x per round, v2 measured over "
            f"{a['rounds']} rounds after {a['warmup']} settling rounds")


def markdown(d: dict, md) -> str:
    """The docs/BENCHMARKS.md table of a results file (`md(columns, rows)` renders one; bench/report.py)."""
    return "\n".join([title(d["args"]), "", md(COLUMNS, table_rows(d["results"])), "", CAPTION + "."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument("--k", type=int, default=1, help="packets a node uses per round (min_peers): mesh degree k + 3 sqrt(k)")
    ap.add_argument("--rounds", type=int, default=3, help="v2 rounds measured")
    ap.add_argument("--warmup", type=int, default=3, help="v2 rounds after everyone joined, before measuring")
    ap.add_argument("--round-s", type=float, default=30.0, help="seconds per round (the node's default deadline)")
    ap.add_argument("--polls", type=int, default=4, help="v1 polls of the key per round (one per 0.25 s of waiting)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    started, info = time.time(), C.machine_info()
    results = []
    for n in args.nodes:
        results.append(v1_model(n, args.polls))
        results.append(v2_sim(n, args.k, args.rounds, args.round_s, args.seed, args.warmup))
        r = results[-1]
        print(f"  N={n:6d}: v2 degree {r['degree']:.2f} (min {r['degree_min']}, max {r['degree_max']}), "
              f"{r['msgs']:.1f} msgs {r['bytes'] / 1e3:.1f} KB per node-round; busiest {r['busiest_msgs']:.0f} msgs; "
              f"join: node 0 {r['join']['node0_frames']} frames ({r['sim_s']:.0f} s)", flush=True)
    C.print_table("Discovery cost by message counts: " + title(vars(args)), COLUMNS, table_rows(results), caption=CAPTION)
    path = C.write_results("discovery_sim", results, args, info, started, out=args.out)
    print(f"wrote {C.shown(path)} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())

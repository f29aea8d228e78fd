"""`MemoryTransport`: the `Transport` inside one process, for tests (no libp2p, no sockets, no threads).

A `MemoryNetwork` is the shared medium: its running members and the packets each serves, behind
one lock, so nodes running on different threads may share it. Discovery is discovery v2 itself:
each member keeps a `announce.Mesh` of neighbors, pushes its announcement to them when it offers,
and judges what it receives (junk refused, oversize offers stripped) exactly as the libp2p
transport does; "dialling" a member is a function call, and every member is a candidate (as
if read from the DHT's membership keys). Collecting runs the very loop the libp2p transport runs
(`collect.collect_offers`: per-peer limits, each digest delivered once, stale offers counted,
`min_peers`, the deadline) over the neighbors' announcements, so what a test of the exchange
sees over memory is what it would see over libp2p, minus the network.

    network = MemoryNetwork()
    a, b = MemoryTransport(network, "QmA"), MemoryTransport(network, "QmB")
    a.start(); b.start()
    a.offer(1, 1, data)
    b.collect(1, 1, min_peers=1, deadline_s=5).packets  # -> [Received("QmA", 1, digest, data)]
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

from swarm_node.config import SwarmConfig
from swarm_node.net import Collected, PeerInfo, SwarmError
from swarm_node.net.announce import Mesh
from swarm_node.net.scores import MeshParams
from swarm_node.net.collect import CollectLimits, Delivery, collect_offers
from swarm_node.net.fetch import MISMATCH, OVERSIZE, Offers
from swarm_node.net.records import STATUS_NOT_FOUND, STATUS_OK
from swarm_node.wire import codec
from swarm_node.wire.codec import PROTOCOL_VERSION

LOCAL_POLL_S = 0.05  # collect re-reads the neighbors' announcements this often (as the libp2p transport does)


class MemoryNetwork:
    """Running members (anything with `answer(peer, announcement) -> reply`) and the packets each
    serves, keyed by peer id. Thread-safe: one re-entrant lock guards every member's mesh."""

    def __init__(self):
        self.lock = threading.RLock()
        self._members: dict[str, object] = {}
        self._packets: dict[str, dict[str, bytes]] = {}
        self._bytes_out: dict[str, int] = {}

    def join(self, peer_id: str, member: object) -> None:
        with self.lock:
            self._members[peer_id] = member
            self._packets.setdefault(peer_id, {})
            self._bytes_out.setdefault(peer_id, 0)

    def leave(self, peer_id: str) -> None:
        with self.lock:
            self._members.pop(peer_id, None)
            self._packets.pop(peer_id, None)

    def members(self, exclude: str) -> list[tuple[str, list[str]]]:
        """Every running member but `exclude`, as (peer id, addresses): the candidates a DHT read gives."""
        with self.lock:
            return [(pid, [f"/memory/{pid}"]) for pid in sorted(self._members) if pid != exclude]

    def exchange(self, src: str, dst: str, announcement: dict) -> dict | None:
        """`src` announces to `dst`; `dst`'s reply (None: `dst` is not running)."""
        with self.lock:
            member = self._members.get(dst)
            return member.answer(src, announcement) if member is not None else None

    def serve_as(self, peer_id: str, packets: dict[str, bytes]) -> None:
        with self.lock:
            self._packets[peer_id] = dict(packets)

    def publish(self, info: PeerInfo, packets: dict[str, bytes], run_id: str | None = None) -> None:
        """A scripted (e.g. hostile) member: `info` is announced to every running member, which may
        take it as a neighbor, and `packets` (digest -> bytes) are what it serves. The record and the
        bytes need not agree, and the announcement is not checked here: receivers judge it."""
        scripted = _Scripted(info, run_id)
        self.join(info.peer_id, scripted)
        self.serve_as(info.peer_id, packets)
        with self.lock:
            for pid, member in list(self._members.items()):
                if isinstance(member, MemoryTransport) and member.peer_id != info.peer_id:
                    member.answer(info.peer_id, scripted.announcement(member.cfg.run_id))

    def serve(self, peer_id: str, digest: str) -> bytes | None:
        """The bytes `peer_id` serves for `digest` (None if it left or does not serve it)."""
        with self.lock:
            data = self._packets.get(peer_id, {}).get(digest)
            if data is not None:
                self._bytes_out[peer_id] += len(data)
            return data

    def bytes_out(self, peer_id: str) -> int:
        with self.lock:
            return self._bytes_out.get(peer_id, 0)


class _Scripted:
    """A member that announces a fixed `PeerInfo` and accepts every announcement."""

    def __init__(self, info: PeerInfo, run_id: str | None):
        self.info, self.run_id = dataclasses.replace(info, offers=list(info.offers)), run_id

    def announcement(self, run_id: str) -> dict:
        i = self.info
        return {"run_id": self.run_id or run_id, "seq": time.time_ns() // 1000, "degree": 0, "model_id": i.model_id,
                "tokenizer": i.tokenizer, "protocol": i.protocol, "round": i.round, "policy_version": i.policy_version,
                "offers": [list(o) for o in i.offers], "addrs": [], "peers": [], "produces": i.produces}

    def answer(self, peer: str, announcement: dict) -> dict:
        run_id = announcement.get("run_id") if isinstance(announcement, dict) else None
        return {"status": STATUS_OK, **self.announcement(run_id if isinstance(run_id, str) else "")}


class MemoryTransport:
    """Every method runs on the caller's thread, and all of one transport's calls must come from
    one thread (the node's): its `Delivery` memory is not locked. `collect` runs a short-lived
    event loop of its own. Settings (limits, timeouts, min_peers for the mesh degree) come from
    `cfg`, the defaults by default."""

    def __init__(self, network: MemoryNetwork, peer_id: str, model_id: str = "m", tokenizer: str = "t",
                 protocol: int = PROTOCOL_VERSION, cfg: SwarmConfig | None = None, manifest: str | None = None):
        self.network, self._peer_id = network, peer_id
        self.model_id, self.tokenizer, self.protocol = model_id, tokenizer, protocol
        self.cfg = cfg if cfg is not None else SwarmConfig()
        self._offers = Offers(self.cfg.max_offers)
        self._round = self._policy_version = 0
        self._delivery = Delivery()
        params = MeshParams.for_config(self.cfg.min_peers, self.cfg)
        self._mesh = Mesh(peer_id, self.cfg.run_id, protocol, params, manifest=manifest)
        self._stats = {"bytes_in": 0, "packets_in": 0, "fetch_failures": 0, "fetch_not_found": 0,
                       "fetch_oversize": 0, "digest_mismatches": 0, "fetch_timeouts": 0, "announces_sent": 0}
        self._state = "new"  # -> "running" -> "closed"

    @property
    def peer_id(self) -> str:
        return self._peer_id

    def start(self) -> None:
        if self._state != "new":
            raise SwarmError("a transport starts once; create a new one to restart")
        self._state = "running"
        self.network.join(self._peer_id, self)
        self._announce()

    def set_manifest(self, digest: str, required: bool = False) -> None:
        """Announce this run-manifest digest and refuse peers announcing another, or none when
        `required` (call before start)."""
        if self._state != "new":
            raise SwarmError("set_manifest must be called before start()")
        self._mesh.manifest, self._mesh.require_manifest = digest, required

    def join_addrs(self) -> list[str]:
        return [f"/memory/{self._peer_id}"]

    def offer(self, round: int, policy_version: int, data: bytes) -> str:
        self._check_running()
        data = bytes(data)
        if len(data) > self.cfg.max_packet_bytes:
            raise ValueError(f"packet of {len(data)} bytes exceeds max_packet_bytes")
        digest = codec.digest(data)
        self._offers.add(int(round), digest, data)
        self._delivery.own(digest, int(round))
        self._round, self._policy_version = int(round), int(policy_version)
        self._announce()
        return digest

    def collect(self, oldest: int, newest: int, min_peers: int, deadline_s: float) -> Collected:
        self._check_running()
        self._fill()

        async def list_peers(timeout: float) -> list[PeerInfo]:  # starving, knockers on trial too
            with self.network.lock:
                trials = [dataclasses.replace(i, offers=list(i.offers)) for i in self._mesh.trials(time.time())]
            return self.peers() + trials

        limits = dataclasses.replace(CollectLimits.from_config(self.cfg), poll_s=LOCAL_POLL_S)
        with self.network.lock:
            credited = self._mesh.credited()
        got = asyncio.run(collect_offers(
            list_peers, self._afetch, limits, self._delivery, wanted=lambda r: oldest <= r <= newest,
            min_count=min_peers, deadline_s=deadline_s, oldest=oldest, newest=newest,
            keep=lambda p: p.protocol == self.protocol, first=credited.__contains__))
        with self.network.lock:
            got.dropped.update(self._mesh.take_dropped())
        return got

    def distrust(self, peer_id: str, digest: str) -> None:
        self._delivery.distrust(peer_id, digest)

    def measure(self) -> None:
        with self.network.lock:
            self._mesh.measuring = True

    def credit(self, peer_id: str, useful: bool = True, taken: bool = True) -> None:
        with self.network.lock:
            self._mesh.credit(peer_id, time.time(), useful, taken)

    def neighbours(self) -> dict[str, dict]:
        with self.network.lock:
            return self._mesh.scores()

    def peers(self) -> list[PeerInfo]:
        """Our neighbors' latest announcements (copies)."""
        with self.network.lock:
            self._mesh.expire(time.time())
            return [dataclasses.replace(i, offers=list(i.offers)) for i in self._mesh.infos()]

    def stats(self) -> dict[str, int]:
        return {**self._stats, "bytes_out": self.network.bytes_out(self._peer_id)}

    def close(self) -> None:
        if self._state == "running":
            with self.network.lock:  # tell our neighbors we leave: they drop us at once
                for peer in list(self._mesh.neighbors):
                    self.network.exchange(self._peer_id, peer, self._mesh.leaving(peer))
            self.network.leave(self._peer_id)
        self._state = "closed"

    def _check_running(self) -> None:
        if self._state != "running":
            raise SwarmError("the memory transport is not running (call start() first)")

    # ---- discovery v2, with function calls for streams ---------------------------------------------------
    def answer(self, peer: str, announcement: dict) -> dict:
        """Another member's announcement arrived (the network calls this under its lock)."""
        return self._mesh.receive(peer, announcement, time.time())

    def _announce(self) -> None:
        """Serve our newest packets, and push our announcement to every neighbor; dial members while short."""
        with self.network.lock:
            offers = self._offers.announced()
            self.network.serve_as(self._peer_id, {d: self._offers.get(d) for _, d, _ in offers})
            self._mesh.set_own(self.model_id, self.tokenizer, self._round, self._policy_version, offers,
                               self.join_addrs())
            for peer in list(self._mesh.neighbors):
                self._contact(peer)
            self._fill()

    def _fill(self) -> None:
        with self.network.lock:
            now = time.time()
            self._mesh.expire(now)
            self._mesh.prune(now)
            self._mesh.evict(now)
            self._mesh.learn(self.network.members(exclude=self._peer_id))
            for peer, _ in self._mesh.rescue(now):  # eclipsed: dial out even when full
                self._contact(peer)
            while self._mesh.short():
                found = self._mesh.candidates(1, now)
                if not found:
                    break
                self._contact(found[0][0])

    def _contact(self, peer: str) -> None:
        now = time.time()
        reply = self.network.exchange(self._peer_id, peer, self._mesh.announcement(to=peer))
        self._stats["announces_sent"] += 1
        if reply is None:
            self._mesh.on_failure(peer, now)
        else:
            self._mesh.on_reply(peer, reply, now)

    async def _afetch(self, peer_id: str, digest: str, timeout: float, declared: int) -> tuple[bytes | None, str]:
        """The libp2p transport's outcomes, without the network: not_found, oversize, mismatch or ok."""
        data = self.network.serve(peer_id, digest)
        if data is None:
            reason = STATUS_NOT_FOUND
        elif len(data) > min(declared, self.cfg.max_packet_bytes):
            reason = OVERSIZE
        elif codec.digest(data) != digest:
            reason = MISMATCH
        else:
            self._stats["bytes_in"] += len(data)
            self._stats["packets_in"] += 1
            with self.network.lock:
                self._mesh.fetched(peer_id, "ok")
            return data, "ok"
        self._stats["fetch_failures"] += 1
        self._stats[{STATUS_NOT_FOUND: "fetch_not_found", OVERSIZE: "fetch_oversize"}.get(reason, "digest_mismatches")] += 1
        if reason != STATUS_NOT_FOUND:
            self.distrust(peer_id, digest)
        with self.network.lock:
            self._mesh.fetched(peer_id, reason)
        return None, reason

"""`HivemindTransport`: the `Transport` over libp2p, via hivemind's P2P daemon client and DHT node.

Discovery (`discovery`; protocol/SPEC.md section 11):
    push     (v2, default) each node keeps D ~ k + 3 sqrt(k) neighbors and pushes its offers to them
             over `/swarm-node/announce/2.0.0` streams (`announce.py`); small signed membership records
             sit in a few capped DHT keys, refreshed rarely and read only when a node runs out of
             candidates (`discovery.MemberDirectory`). Cost per node and round: O(D), not O(N).
    dht-key  (v1) every node's signed record under one DHT key, polled whole (`discovery.PeerDirectory`);
             kept so bench/scale.py can run both side by side.
Transfer: a peer's packet is pulled over a libp2p stream to its authenticated id (`fetch.py`), under the
per-peer limits of `collect.py`. Bootstrap: any one of `cfg.peers` answering is enough (else retried).

`P2P` (a p2pd child process) and `DHTNode` run on a private event loop (`loop.LoopThread`) of this
process; no `hivemind.DHT`, which forks. All hivemind attributes that are not public API are used
in `hivemind_internals.py` and nowhere else.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path

import hivemind.utils.logging as _hm_logging
import psutil
from hivemind.dht.node import DHTNode
from hivemind.p2p import P2P, PeerID
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from swarm_node.config import SwarmConfig
from swarm_node.net import Collected, PeerInfo, SwarmError
from swarm_node.net.announce import Mesh
from swarm_node.net.collect import CollectLimits, Delivery, collect_offers
from swarm_node.net.daemon import CONNECT_TIMEOUT_S, start_daemon
from swarm_node.net.discovery import (DHT_OP_TIMEOUT_S, MemberDirectory, PeerDirectory, PushDiscovery, RecordValidator,
                                      parse_initial_peers)
from swarm_node.net.fetch import (ERROR, MISMATCH, OVERSIZE, TIMEOUT, Download, Offers, PacketServer, StreamLimits,
                                  download_packet, raise_fd_limit)
from swarm_node.net.hivemind_internals import (cap_dictionary_values, create_dht, dial, guard_dht_requests, has_routes,
                                               open_stream, p2pd_pid, ping, wrap_rsa_key)
from swarm_node.net.identity import IdentityLock, load_or_create_identity, peer_id_of
from swarm_node.net.lanes import Kind, register_plainly
from swarm_node.net.loop import CallTimeout, LoopThread
from swarm_node.net.reach import DIALBACK_PROTOCOL, DialbackServer, Reachability, announce_order
from swarm_node.net.records import (FETCH_PROTOCOLS, MAX_ADDRS, MAX_BUCKET_ENTRIES, MAX_MEMBER_TTL_S,
                                    STATUS_BAD_REQUEST, STATUS_BUSY, STATUS_NOT_FOUND, is_digest, make_record)
from swarm_node.net.scores import MeshParams, PeerLimiter, load_anchors, subnet_of
from swarm_node.wire import codec
from swarm_node.wire.codec import PROTOCOL_VERSION

logger = logging.getLogger(__name__)
DISCOVERY_MODES = ("push", "dht-key")  # v2 (default) | v1: bench/scale.py, and tests' out-of-mesh hosts
DHT_RPC_TIMEOUT_S = 3.0  # one hivemind DHT RPC (ping/store/find); hivemind's default
MAX_BOOTSTRAP_RETRY_S = 300.0  # while alone, retries back off from bootstrap_retry_s to this
LOCAL_POLL_S = 0.05  # v2: collect re-reads the neighbors' announcements this often while waiting
STARTUP_MARGIN_S = 30.0  # DHT creation and the first bootstrap, on top of swarm.start_timeout_s for p2pd
STAT_KEYS = (
    "bytes_in", "bytes_out", "packets_in", "packets_served", "fetch_failures", "fetch_timeouts", "fetch_resumes",
    "fetch_not_found", "fetch_busy", "fetch_oversize", "digest_mismatches", "records_rejected",
    "records_published", "publish_failures", "bootstrap_attempts", "serve_not_found", "serve_errors",
    "announces_sent", "announces_received", "announce_bytes_out", "announce_bytes_in", "announces_refused",
    "announce_failures", "members_published", "member_reads",
)  # and from stats(): streams_over_rate, peers_graylisted (PeerLimiter), shields; v2 mesh gauges (PushDiscovery.gauges)
FAILURE_STATS = {TIMEOUT: "fetch_timeouts", STATUS_NOT_FOUND: "fetch_not_found", STATUS_BUSY: "fetch_busy",
                 OVERSIZE: "fetch_oversize", MISMATCH: "digest_mismatches"}


def route_hivemind_logs() -> None:
    """hivemind logs through the application's handlers (and their repeat filter), at WARNING unless
    HIVEMIND_LOGLEVEL says otherwise. Called when a transport is made, not at import: importing this
    module changes no logging configuration."""
    _hm_logging.use_hivemind_log_handler("nowhere")
    if "HIVEMIND_LOGLEVEL" not in os.environ:
        logging.getLogger("hivemind").setLevel(logging.WARNING)


# ---- the transport ------------------------------------------------------------------------------------
class HivemindTransport:
    """The libp2p `Transport`, configured by `SwarmConfig` (peers, identity, addresses, limits).

    Threads: public methods are synchronous, bounded in time, and may be called from any thread
    but the transport's own. Every piece of mutable state (the packets we serve, our round, the
    `Delivery` memory of what was delivered, taken, counted and distrusted) is read and written on
    the transport's event-loop thread only: each public method hops onto it through `_run`, so no
    lock guards them. `stats()` copies counters whose keys never change, safe from any thread.

    `discovery`: "push" (v2) or "dht-key" (v1); default `cfg.discovery` if the config has it, else
    "push". `mesh_k`: packets the node wants per round, which sets its neighbor count
    D = k + 3 sqrt(k) (default `cfg.min_peers`)."""

    def __init__(self, cfg: SwarmConfig, model_id: str, tokenizer: str, protocol: int = PROTOCOL_VERSION,
                 discovery: str | None = None, mesh_k: int | None = None, produces: bool = True,
                 manifest: str | None = None):
        route_hivemind_logs()
        self.cfg, self.model_id, self.tokenizer, self.protocol = cfg, model_id, tokenizer, protocol
        self.produces = produces  # False: announce that we offer no packets (relay, light client)
        self.manifest = manifest  # digest of our run manifest, announced; set before start (set_manifest)
        self._require_manifest = False  # refuse peers announcing no manifest (prompts by reference)
        self._measure = False  # accepted packets are credited (measure(), before start): idle neighbors may go
        self.discovery = discovery or getattr(cfg, "discovery", "push")
        if self.discovery not in DISCOVERY_MODES:
            raise SwarmError(f"swarm.discovery must be one of {'|'.join(DISCOVERY_MODES)}, got {self.discovery!r}")
        self._mesh_k = cfg.min_peers if mesh_k is None else mesh_k
        self._initial = parse_initial_peers(list(cfg.peers))
        self._stats: dict[str, int] = {k: 0 for k in STAT_KEYS}
        self._offers = Offers(cfg.max_offers)  # the packets we serve
        self._round = self._policy_version = 0
        self._delivery = Delivery()
        self._limiter = PeerLimiter()  # per-peer stream rates and graylist (net/scores.py)
        # v2: our best outbound neighbours, kept beside a persistent identity and dialled first at the next start
        self._anchors_path = Path(cfg.identity + ".anchors") if getattr(cfg, "identity", None) else None
        self._loop, self._p2p = None, None  # LoopThread, P2P once started
        self._dht: DHTNode | None = None
        self._directory: PeerDirectory | None = None  # v1
        self._push: PushDiscovery | None = None  # v2
        self._addrs: list[str] = []  # our transport addresses (without /p2p), as announced to peers
        self._alone_since: float | None = None
        self._server: PacketServer | None = None
        self._tasks: list[asyncio.Task] = []
        self._id_lock: IdentityLock | None = None
        self._p2pd_pid: int | None = None
        self._peer_id: str | None = None
        self._started = self._closed = False
        self._dialback_server = DialbackServer(rates=self._limiter, limits=StreamLimits(1, 16), group_of=subnet_of)
        self.reachability = Reachability("unknown", "not started", [])
        self._state_lock = threading.Lock()  # guards _started / _closed only

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        with self._state_lock:
            if self._started or self._closed:
                raise SwarmError("a transport starts once; create a new one to restart")
            self._started = True
        try:
            if self.cfg.identity is not None:
                self._id_lock = IdentityLock(self.cfg.identity)
            key, raw = load_or_create_identity(self.cfg.identity)
            self._peer_id = peer_id_of(key.public_key())
            raise_fd_limit()  # before p2pd starts (it inherits the limit): held streams must not hit 1,024 fds
            self._loop = LoopThread("swarm-transport")
            try:
                self._loop.run(self._astart(wrap_rsa_key(key), raw), self.cfg.start_timeout_s + STARTUP_MARGIN_S)
            except CallTimeout:
                raise SwarmError(f"swarm transport did not start within {self.cfg.start_timeout_s + STARTUP_MARGIN_S:.0f}"
                                 " s (raise swarm.start_timeout_s on a slow machine)") from None
        except BaseException as e:
            self.close()
            if isinstance(e, SwarmError) or not isinstance(e, Exception):
                raise
            raise SwarmError(f"could not start the swarm transport: {e}") from e
        atexit.register(self.close)
        logger.info("swarm transport up: peer id %s, run %r, discovery %s, listening on %s",
                    self._peer_id, self.cfg.run_id, self.discovery, " ".join(self.join_addrs()))

    async def _astart(self, key: RSAPrivateKey, identity: bytes) -> None:
        self._p2p, self.reachability = await start_daemon(self.cfg, identity, self._initial, self._peer_id)
        self._p2pd_pid = p2pd_pid(self._p2p)
        if str(self._p2p.peer_id) != self._peer_id:
            raise SwarmError(f"p2pd reports peer id {self._p2p.peer_id}, expected {self._peer_id}")
        self._server = PacketServer(self.cfg.run_id, self._offers.get, self._stats, rates=self._limiter,
                                    favoured=lambda peer: self._push is not None and self._push.favoured(peer))
        kinds = {"fetch": Kind(FETCH_PROTOCOLS, lambda info, reader, writer: self._server.handle(  # new id first
            reader, writer, info.peer_id))}
        await self._p2p.add_binary_stream_handler(  # never shut: a joiner's one check (red team 23), rate-limited
            DIALBACK_PROTOCOL, lambda info, reader, writer: self._dialback_server.handle(
                str(info.peer_id), str(info.addr), reader, writer))
        self._addrs = self.reachability.addrs[:MAX_ADDRS]
        if self.discovery == "push":  # lanes: fetch and announcement ids per neighbour, shut to strangers in a flood
            await self._astart_push(key, kinds)
        else:
            await register_plainly(self._p2p, kinds)  # v1: the public ids only, never shut
            validator = RecordValidator(key, self.cfg.run_id, self._stats)
            self._dht = await create_dht(self._p2p, validator, DHT_RPC_TIMEOUT_S, self.reachability.mode == "private")
            self._directory = PeerDirectory(self._dht, validator, self.cfg.run_id, self._peer_id, self._stats)
        guard_dht_requests(self._p2p, self._limiter.allow_dht)  # per-peer and total rates, size: before parsing
        if self._initial and not await self._bootstrap_once():
            self._alone_since = time.monotonic()
            logger.warning("none of the %d initial peers answered (%s); running alone and retrying in %.0f s, then "
                           "with backoff up to %.0f s", len(self._initial), ", ".join(str(m) for _, m in self._initial),
                           self.cfg.bootstrap_retry_s, MAX_BOOTSTRAP_RETRY_S)
        loop = asyncio.get_running_loop()
        if self.discovery == "push":
            self._tasks = await self._push.start(self._own())  # dials the initial peers now
        else:
            await self._astore_record()
            self._tasks = [loop.create_task(self._republish_loop())]
        self._tasks.append(loop.create_task(self._bootstrap_loop()))

    async def _astart_push(self, key: RSAPrivateKey, kinds: dict[str, Kind]) -> None:
        """Discovery v2: a DHT that holds only capped membership buckets (no caching of found values,
        so a holder serves only what it stores), and the announcement mesh on top."""
        validator = RecordValidator.members(key, self.cfg.run_id, self._stats)
        self._dht = await create_dht(self._p2p, validator, DHT_RPC_TIMEOUT_S, self.reachability.mode == "private")
        cap_dictionary_values(self._dht, MAX_BUCKET_ENTRIES)
        members = MemberDirectory(self._dht, validator, self.cfg.run_id, self._peer_id, self.protocol, self._stats)
        params = MeshParams.for_config(self._mesh_k, self.cfg)
        initial = {str(pid): [str(maddr)] for pid, maddr in self._initial if str(pid) != self._peer_id}
        mesh = Mesh(self._peer_id, self.cfg.run_id, self.protocol, params, initial, manifest=self.manifest,
                    anchors=load_anchors(self._anchors_path))
        mesh.require_manifest, mesh.measuring = self._require_manifest, self._measure
        self._push = PushDiscovery(self._p2p, mesh, members, self._stats, self._limiter, self._anchors_path, kinds,
                                   lane_secret=key.to_bytes())
        member_ttl = min(MAX_MEMBER_TTL_S, 5 * self.cfg.record_ttl_s)
        await self._push.listen(self._addrs, member_ttl)

    def close(self) -> None:
        """Stop p2pd and the transport thread. Idempotent; also runs at interpreter exit."""
        if self._loop is not None and self._loop.on_loop_thread():
            raise RuntimeError("close() must not be called from the transport thread")
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        if self._loop is not None:
            if self._loop.thread.is_alive():
                try:
                    self._loop.run(self._aclose(), 20)
                except Exception as e:
                    logger.warning("swarm transport shutdown was not clean: %r", e)
            self._loop.stop()
        self._kill_p2pd()
        if self._id_lock is not None:
            self._id_lock.release()

    async def _aclose(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._push is not None:
            await self._push.close()
        for what, part, timeout in (("DHT", self._dht, 5), ("p2pd", self._p2p, 10)):
            if part is not None:
                try:
                    await asyncio.wait_for(part.shutdown(), timeout)
                except Exception:
                    logger.debug("%s shutdown failed", what, exc_info=True)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        if others:
            await asyncio.wait(others, timeout=2)
        await asyncio.sleep(0.05)  # let closed transports run their connection_lost callbacks

    def _kill_p2pd(self) -> None:
        pid = self._p2pd_pid
        try:
            proc = psutil.Process(pid) if pid is not None else None
            if proc is not None and proc.ppid() == os.getpid() and proc.status() != psutil.STATUS_ZOMBIE:
                logger.warning("p2pd (pid %d) did not exit; killing it", pid)
                os.kill(pid, signal.SIGKILL)
                proc.wait(5)
        except (psutil.Error, OSError, ChildProcessError):
            pass

    def __enter__(self) -> HivemindTransport:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, coro, timeout: float):
        """Run `coro` on the transport's loop, cancelled after `timeout` seconds (SwarmError)."""
        if not self._started or self._closed or self._loop is None:
            coro.close()
            raise SwarmError("the swarm transport is not running (call start() first)")
        try:
            return self._loop.run(coro, timeout)
        except CallTimeout:
            raise SwarmError(f"swarm transport did not answer within {timeout:.0f} s") from None

    # ---- Transport ----------------------------------------------------------------------------------
    @property
    def peer_id(self) -> str:
        if self._peer_id is None:
            raise SwarmError("peer id is known after start()")
        return self._peer_id

    def set_manifest(self, digest: str, required: bool = False) -> None:
        """Announce this run-manifest digest and refuse peers announcing another, or none when
        `required` (call before start)."""
        if self._started:
            raise SwarmError("set_manifest must be called before start()")
        self.manifest, self._require_manifest = digest, required

    def join_addrs(self) -> list[str]:
        """Full multiaddrs (with /p2p/<peer id>) others can bootstrap from: relayed first, loopback last."""
        async def get():
            return [str(m) for m in await self._p2p.get_visible_maddrs(latest=True)]
        return announce_order(self._run(get(), 10))

    def offer(self, round: int, policy_version: int, data: bytes) -> str:
        """Serve `data`, keeping the newest `max_offers` packets, and publish our record; its digest."""
        data = bytes(data)
        if len(data) > self.cfg.max_packet_bytes:
            raise ValueError(f"packet of {len(data)} bytes exceeds max_packet_bytes")
        digest = codec.digest(data)
        self._run(self._aoffer(int(round), int(policy_version), digest, data), DHT_OP_TIMEOUT_S + 5)
        return digest

    async def _aoffer(self, round: int, policy_version: int, digest: str, data: bytes) -> None:
        self._offers.add(round, digest, data)
        self._delivery.own(digest, round)
        await self._apublish(round, policy_version)

    def publish(self, round: int, policy_version: int) -> None:
        """Announce our offers, round and policy version now: push them to our neighbors (v2; in the
        background) or store our DHT record (v1; also republished every record_ttl_s / 3)."""
        self._run(self._apublish(int(round), int(policy_version)), DHT_OP_TIMEOUT_S + 5)

    async def _apublish(self, round: int, policy_version: int) -> None:
        self._round, self._policy_version = round, policy_version
        if self._push is not None:
            self._push.publish(self._own())
        else:
            await self._astore_record()

    def collect(self, oldest: int, newest: int, min_peers: int, deadline_s: float) -> Collected:
        limits = CollectLimits.from_config(self.cfg)  # v2: the peer list is local memory, re-read often for nothing
        limits = dataclasses.replace(limits, poll_s=LOCAL_POLL_S) if self._push is not None else limits

        async def run() -> Collected:  # credited neighbours are fetched first, from slots of their own
            credited = self._push.mesh.credited() if self._push is not None else set()
            got = await collect_offers(
                lambda t: self._apeers(t, trials=True), self._afetch, limits, self._delivery,
                wanted=lambda r: oldest <= r <= newest, min_count=min_peers, deadline_s=deadline_s, oldest=oldest,
                newest=newest, keep=lambda p: p.protocol == self.protocol, first=credited.__contains__)
            if self._push is not None:
                got.dropped.update(self._push.mesh.take_dropped())  # offers stripped when their announcement arrived
            return got
        return self._run(run(), max(0.0, deadline_s) + DHT_OP_TIMEOUT_S + 10)

    def distrust(self, peer_id: str, digest: str) -> None:
        async def apply():
            self._delivery.distrust(peer_id, digest)
        self._run(apply(), 5.0)

    def measure(self) -> None:  # accepted packets are credited from now on: idle neighbors may lose their slot
        self._measure = True  # read when the mesh is made (start); Exchange calls this before

    def credit(self, peer_id: str, useful: bool = True, taken: bool = True) -> None:
        async def apply():  # v2: the neighbor's slot is earned
            return self._push is not None and self._push.credit(peer_id, useful, taken)
        self._run(apply(), 5.0)

    def neighbours(self) -> dict[str, dict]:
        async def read():  # on the loop thread, where the mesh changes (v1: no mesh)
            return self._push.mesh.scores() if self._push is not None else {}
        return self._run(read(), 5.0)

    def peers(self) -> list[PeerInfo]:
        """This run's live peers as they announced themselves: our neighbors' latest announcements
        (v2), or the valid records under the run's DHT key (v1; [] if the lookup fails)."""
        return self._run(self._apeers(DHT_OP_TIMEOUT_S), DHT_OP_TIMEOUT_S + 5)

    def fetch(self, peer_id: str, digest: str) -> bytes | None:
        """One packet from `peer_id`; None on timeout/refusal/oversize/mismatch (see `stats`)."""
        t = self.cfg.fetch_timeout_s
        data, _ = self._run(self._afetch(peer_id, digest, t), t + 5)
        return data

    def stats(self) -> dict[str, int]:
        rates = {"streams_over_rate": self._limiter.over_rate, "peers_graylisted": self._limiter.graylisted_total,
                 "shields": self._push.lanes.shield.shields if self._push is not None else 0}
        return {**self._stats, **rates, **(self._push.gauges() if self._push is not None else {})}

    # ---- raw streams, for tools (the conformance probe, net/probe.py) -----------------------------------
    async def aopen_stream(self, peer_id: str, protos: tuple[str, ...]) -> tuple[str, asyncio.StreamReader,
                                                                                 asyncio.StreamWriter]:
        """A stream to `peer_id` speaking the first of `protos` it supports: (id negotiated, reader, writer)."""
        info, reader, writer = await open_stream(self._p2p, PeerID.from_base58(peer_id), protos)
        return info.proto, reader, writer

    async def adial(self, peer_id: str, addrs: list[str]) -> None:
        await dial(self._p2p, PeerID.from_base58(peer_id), [Multiaddr(a) for a in addrs])

    def call(self, coro, timeout: float):
        """Run `coro` on the transport's loop, bounded by `timeout` (SwarmError when it runs out)."""
        return self._run(coro, timeout)

    # ---- discovery ----------------------------------------------------------------------------------
    async def _astore_record(self) -> None:
        record = make_record(self._peer_id, self.model_id, self.tokenizer, self.protocol, self._round,
                             self._policy_version, self._offers.announced(), time.time())
        await self._directory.store(record, self.cfg.record_ttl_s)

    async def _apeers(self, timeout: float, trials: bool = False) -> list[PeerInfo]:
        if self._push is not None:  # local: announcements arrive on their own; starving, knockers on trial too
            return self._push.mesh.infos() + (self._push.mesh.trials(time.time()) if trials else [])
        return await self._directory.lookup(timeout)

    def _own(self) -> dict:
        """What our announcement says (v2)."""
        return dict(model_id=self.model_id, tokenizer=self.tokenizer, round=self._round,
                    policy_version=self._policy_version, offers=self._offers.announced(), addrs=self._addrs,
                    produces=self.produces)

    def _connected(self) -> bool:
        return has_routes(self._dht) or bool(self._push is not None and self._push.mesh.neighbors)

    async def _bootstrap_once(self) -> bool:
        self._stats["bootstrap_attempts"] += 1

        async def one(pid: PeerID, maddr: Multiaddr) -> bool:
            if str(pid) == self._peer_id:
                return False
            try:
                await asyncio.wait_for(dial(self._p2p, pid, maddr), CONNECT_TIMEOUT_S)
                return await ping(self._dht, pid)
            except Exception as e:
                logger.debug("bootstrap peer %s: %r", maddr, e)
                return False

        if not any(await asyncio.gather(*(one(p, m) for p, m in self._initial))):
            return False
        try:
            await asyncio.wait_for(self._dht.find_nearest_nodes([self._dht.node_id]), DHT_OP_TIMEOUT_S)
        except Exception:
            logger.debug("find_nearest_nodes after bootstrap failed", exc_info=True)
        return True

    async def _bootstrap_loop(self) -> None:
        """While no initial peer answers, retry after bootstrap_retry_s, doubling up to MAX_BOOTSTRAP_RETRY_S (a log line each)."""
        delay = self.cfg.bootstrap_retry_s
        while True:
            await asyncio.sleep(delay)
            if not self._initial or self._connected():
                delay, self._alone_since = self.cfg.bootstrap_retry_s, None
                continue
            if await self._bootstrap_once():
                alone = time.monotonic() - (self._alone_since or time.monotonic())
                logger.info("joined the swarm through an initial peer after %.0f s alone", alone)
                delay, self._alone_since = self.cfg.bootstrap_retry_s, None
                await self._apublish(self._round, self._policy_version)
                continue
            self._alone_since = self._alone_since or time.monotonic()
            delay = min(MAX_BOOTSTRAP_RETRY_S, 2 * delay)
            logger.warning("alone for %.0f s: none of the %d initial peers answered; next try in %.0f s",
                           time.monotonic() - self._alone_since, len(self._initial), delay)

    async def _republish_loop(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.cfg.record_ttl_s / 3))
            await self._astore_record()

    # ---- fetch ----------------------------------------------------------------------------------------
    async def _afetch(self, peer_id: str, digest: str, timeout: float,
                      max_bytes: int | None = None) -> tuple[bytes | None, str]:
        """(data, "ok") or (None, reason); the bytes come from `peer_id` over an authenticated stream.
        `max_bytes` (the offer's declared size; at most `max_packet_bytes`) bounds what it may send."""
        limit = self.cfg.max_packet_bytes if max_bytes is None else min(max_bytes, self.cfg.max_packet_bytes)
        try:
            pid = PeerID.from_base58(peer_id)
        except Exception:
            return None, STATUS_BAD_REQUEST
        if not is_digest(digest):
            return None, STATUS_BAD_REQUEST
        download = Download(self.cfg.run_id, digest, limit)

        async def stream_to_peer() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            protos = self._push.lanes.protocols(peer_id, "fetch") if self._push is not None else FETCH_PROTOCOLS
            info, reader, writer = await open_stream(self._p2p, pid, protos)  # its lane, the new id, the legacy one
            if info.peer_id != pid:
                writer.close()
                raise SwarmError(f"a stream to {peer_id} reached {info.peer_id}")
            return reader, writer

        timeout = self._push.mesh.knockers.timeout(peer_id, timeout) if self._push is not None else timeout
        try:
            data, reason = await asyncio.wait_for(download_packet(stream_to_peer, download), max(0.01, timeout))
        except asyncio.TimeoutError:
            data, reason = None, TIMEOUT
        except Exception as e:
            logger.debug("fetch %s from %s failed after %d bytes: %r", digest, peer_id, download.received, e)
            data, reason = None, ERROR
        self._stats["fetch_resumes"] += download.resumes
        self._count_fetch(peer_id, digest, data, reason, declared=max_bytes is not None)
        return data, reason

    def _count_fetch(self, peer_id: str, digest: str, data: bytes | None, reason: str, declared: bool) -> None:
        if self._push is not None:  # a neighbour's false offer costs it its slot; a knocker's turn ends
            self._push.mesh.fetched(peer_id, "ok" if data is not None else reason)
        if data is not None:
            self._stats["bytes_in"] += len(data)
            self._stats["packets_in"] += 1
            return
        self._stats["fetch_failures"] += 1
        if reason in FAILURE_STATS:
            self._stats[FAILURE_STATS[reason]] += 1
        if reason == MISMATCH or (reason == OVERSIZE and declared):
            logger.warning("peer %s served %s for %s; ignoring that offer", peer_id,
                           "bytes that do not match" if reason == MISMATCH else "more bytes than it announced", digest)
            self._delivery.distrust(peer_id, digest)

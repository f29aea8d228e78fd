"""Network transport: peer discovery in hivemind's DHT and packet transfer over libp2p streams.

The only module of swarm_node that imports hivemind. ``P2P`` (a p2pd child process) and
``DHTNode`` run in an asyncio loop on a dedicated background thread of *this* process (no
``hivemind.DHT``, which forks); ``Swarm`` exposes a synchronous API to the node loop.
Wire formats, limits and the security argument: protocol/SPEC.md (sections 11-12).
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Container

import psutil
from cryptography.hazmat.primitives.asymmetric import rsa

import hivemind.utils.logging as _hm_logging
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.node import DHTNode
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import raise_if_failed, read_pbmsg_safe, write_pbmsg
from hivemind.proto import p2pd_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from .swarm_identity import (IdentityLock, check_record_value, load_or_create_identity, owner_key_of, owner_peer_id,
                             peer_id_of)
from .swarm_fetch import ERROR, MISMATCH, OVERSIZE, TIMEOUT, PacketServer, collect_offers, request_packet
from .swarm_records import (
    FETCH_PROTOCOL, MAX_OFFERS_IN_RECORD, MAX_SIGNED_RECORD_BYTES,
    STATUS_BAD_REQUEST, STATUS_BUSY, STATUS_NOT_FOUND, PeerInfo, Received, RecordError, SwarmError,
    SwarmSettings, is_digest, make_record, packet_digest, parse_record, record_key,
)

__all__ = ["Swarm", "SwarmSettings", "PeerInfo", "Received", "SwarmError", "SwarmRecordValidator", "packet_digest",
           "load_or_create_identity", "peer_id_of"]

logger = logging.getLogger(__name__)

# hivemind logs through the application's handlers, at WARNING unless HIVEMIND_LOGLEVEL says otherwise.
_hm_logging.use_hivemind_log_handler("nowhere")
if "HIVEMIND_LOGLEVEL" not in os.environ:
    logging.getLogger("hivemind").setLevel(logging.WARNING)

START_TIMEOUT_S = 60.0
DHT_RPC_TIMEOUT_S = 3.0  # one hivemind DHT RPC (ping/store/find); hivemind's default
DHT_OP_TIMEOUT_S = 10.0  # one whole DHT get/store traversal (clamped to collect deadlines)
CONNECT_TIMEOUT_S = 5.0
MAX_PARALLEL_FETCHES = 4
MAX_REMEMBERED = 65536  # entries of each per-(peer, digest|round) memory (bad offers, rounds taken, counted drops)
STAT_KEYS = (
    "bytes_in", "bytes_out", "packets_in", "packets_served", "fetch_failures", "fetch_timeouts",
    "fetch_not_found", "fetch_busy", "fetch_oversize", "digest_mismatches", "records_rejected",
    "records_published", "publish_failures", "bootstrap_attempts", "serve_not_found", "serve_errors",
)


def _wrap_rsa(key: rsa.RSAPrivateKey) -> RSAPrivateKey:
    wrapped = RSAPrivateKey.__new__(RSAPrivateKey)  # hivemind has no from_bytes(); mirror its __setstate__
    wrapped._private_key = key
    return wrapped


# ---- DHT record validator -----------------------------------------------------------------------
class SwarmRecordValidator(RecordValidatorBase):
    """Accepts only records under this run's key whose subkey is ``[owner:<ssh-rsa key>]``, signed
    by that key (hivemind's RSASignatureValidator), whose value matches the schema, and whose
    ``peer_id`` is the libp2p peer id of that same key (a record cannot speak for another peer)."""

    def __init__(self, private_key: RSAPrivateKey, run_id: str, stats: dict | None = None):
        self._rsa = RSASignatureValidator(private_key)
        self._key_id = DHTID.generate(source=record_key(run_id)).to_bytes()
        self.stats = stats if stats is not None else {"records_rejected": 0}

    @property
    def local_public_key(self) -> bytes:
        return self._rsa.local_public_key  # b"[owner:ssh-rsa AAAA...]", the subkey of our record

    def check(self, record: DHTRecord) -> str | None:
        """None if valid, else the reason."""
        if record.key != self._key_id:
            return "key is not this run's peers key"
        if record.subkey is None or len(record.value) > MAX_SIGNED_RECORD_BYTES:
            return "missing subkey or oversized value"
        owner = owner_key_of(record.subkey)
        if owner is None:  # checked first: RSASignatureValidator accepts records without an owner
            return "subkey must be exactly [owner:<ssh-rsa public key>]"
        if owner_peer_id(owner) is None:  # before hivemind parses it: a malformed key would raise there
            return "owner key is not an RSA public key of >= 2048 bits"
        try:
            if not self._rsa.validate(record):
                return "bad signature"
        except Exception:  # hostile bytes must give a reason, never an exception inside a DHT RPC handler
            return "bad signature"
        return check_record_value(owner, self._rsa.strip_value(record), record.expiration_time)

    def validate(self, record: DHTRecord) -> bool:
        reason = self.check(record)
        if reason is not None:
            self.stats["records_rejected"] = self.stats.get("records_rejected", 0) + 1
            logger.debug("rejected DHT record: %s", reason)
        return reason is None

    def sign_value(self, record: DHTRecord) -> bytes:
        return self._rsa.sign_value(record)

    def strip_value(self, record: DHTRecord) -> bytes:
        return self._rsa.strip_value(record)

    @property
    def priority(self) -> int:
        return 10


def _parse_initial_peers(maddrs: list[str]) -> list[tuple[PeerID, Multiaddr]]:
    out = []
    for s in maddrs:
        s = s.strip()
        if not s:
            continue
        try:
            m = Multiaddr(s)
            pid = PeerID.from_base58(m["p2p"])
            out.append((pid, m.decapsulate(Multiaddr(f"/p2p/{pid}"))))  # p2pd wants the transport part only
        except Exception:
            raise SwarmError(f"bad initial peer {s!r}: expected a multiaddr like "
                             "/ip4/1.2.3.4/tcp/31337/p2p/<peer id> (copy it from the other node's log)") from None
    return out


def _is_loopback(maddr: str) -> bool:
    return maddr.startswith("/ip4/127.") or maddr.startswith("/ip6/::1/")


class Swarm:
    """Synchronous facade over P2P + DHTNode running on a private event-loop thread. Methods may be
    called from any thread except the transport thread; every call is bounded in time."""

    def __init__(self, settings: SwarmSettings, model_id: str, tokenizer: str, protocol: int = 1):
        if not settings.run_id or not isinstance(settings.run_id, str):
            raise SwarmError("run_id must be a non-empty string")
        if not 1 <= settings.max_offers <= MAX_OFFERS_IN_RECORD:
            raise SwarmError(f"max_offers must be in [1, {MAX_OFFERS_IN_RECORD}]")
        self.settings = settings
        self.model_id, self.tokenizer, self.protocol = model_id, tokenizer, protocol
        self.stats: dict[str, int] = {k: 0 for k in STAT_KEYS}
        self._initial = _parse_initial_peers(list(settings.initial_peers or []))
        self._key = record_key(settings.run_id)
        self._offers: OrderedDict[str, tuple[int, bytes]] = OrderedDict()  # digest -> (round, data)
        self._round = self._policy_version = 0
        self._lock = threading.Lock()
        self._bad: set[tuple[str, str]] = set()  # (peer, digest) never to fetch again (wrong bytes, not its packet)
        self._taken: OrderedDict[tuple[str, int], str] = OrderedDict()  # (peer, round) -> digest fetched for it
        self._counted: set[tuple[str, str, str]] = set()  # (peer, digest, reason) of offers already counted as dropped
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._p2p: P2P | None = None
        self._dht: DHTNode | None = None
        self._tasks: list[asyncio.Task] = []
        self._id_lock: IdentityLock | None = None
        self._p2pd_pid: int | None = None
        self._peer_id: str | None = None
        self._started = self._closed = False
        self._state_lock = threading.Lock()

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        with self._state_lock:
            if self._started or self._closed:
                raise SwarmError("Swarm.start() may be called once; create a new Swarm to restart")
            self._started = True
        path = self.settings.identity_path
        try:
            if path is not None:
                self._id_lock = IdentityLock(path)
            key, raw = load_or_create_identity(path)
            self._peer_id = peer_id_of(key.public_key())
            self._validator = SwarmRecordValidator(_wrap_rsa(key), self.settings.run_id, self.stats)
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="swarm-transport", daemon=True)
            self._thread.start()
            fut = asyncio.run_coroutine_threadsafe(self._astart(raw), self._loop)
            try:
                fut.result(START_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                fut.cancel()
                raise SwarmError(f"swarm transport did not start within {START_TIMEOUT_S:.0f} s") from None
        except BaseException as e:
            self.shutdown()
            if isinstance(e, SwarmError) or not isinstance(e, Exception):
                raise
            raise SwarmError(f"could not start the swarm transport: {e}") from e
        atexit.register(self.shutdown)
        logger.info("swarm transport up: peer id %s, run %r, listening on %s",
                    self._peer_id, self.settings.run_id, " ".join(self.visible_maddrs()))

    async def _astart(self, identity: bytes) -> None:
        s = self.settings
        host_maddrs = list(s.host_maddrs) or ["/ip4/0.0.0.0/tcp/0"]
        nat = bool(s.nat_traversal)
        tmpdir = tempfile.mkdtemp(prefix="swarm-node-")
        try:  # p2pd reads the key from a file; give it our key so the peer id matches the record key
            id_file = os.path.join(tmpdir, "identity.key")
            with open(os.open(id_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                f.write(identity)
            self._p2p = await P2P.create(
                host_maddrs=host_maddrs, announce_maddrs=list(s.announce_maddrs) or None,
                identity_path=id_file, check_if_identity_free=False, nat_port_map=nat, auto_nat=nat,
                use_relay=nat, startup_timeout=30)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
        self._p2pd_pid = self._p2p._child.pid if self._p2p._child is not None else None
        if str(self._p2p.peer_id) != self._peer_id:
            raise SwarmError(f"p2pd reports peer id {self._p2p.peer_id}, expected {self._peer_id}")
        self._server = PacketServer(s.run_id, self._lookup, self.stats)
        await self._p2p.add_binary_stream_handler(
            FETCH_PROTOCOL, lambda info, reader, writer: self._server.handle(reader, writer, info.peer_id))
        self._dht = await DHTNode.create(p2p=self._p2p, record_validator=self._validator,
                                         wait_timeout=DHT_RPC_TIMEOUT_S, num_workers=2)
        self._publish_lock = asyncio.Lock()
        if self._initial and not await self._bootstrap_once():
            self._warn_alone()
        await self._astore_record()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._republish_loop()), loop.create_task(self._bootstrap_loop())]

    def shutdown(self) -> None:
        """Stop p2pd and the transport thread. Idempotent; also runs at interpreter exit."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.shutdown)
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            if threading.current_thread() is thread:
                raise RuntimeError("Swarm.shutdown() must not be called from the transport thread")
            try:
                asyncio.run_coroutine_threadsafe(self._ashutdown(), loop).result(20)
            except Exception as e:
                logger.warning("swarm transport shutdown was not clean: %r", e)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        if loop is not None and not (thread is not None and thread.is_alive()):
            loop.close()
        self._kill_p2pd()
        if self._id_lock is not None:
            self._id_lock.release()

    async def _ashutdown(self) -> None:
        for t in self._tasks:
            t.cancel()
        if self._dht is not None:
            try:
                await asyncio.wait_for(self._dht.shutdown(), 5)
            except Exception:
                logger.debug("DHT shutdown failed", exc_info=True)
        if self._p2p is not None:
            try:
                await asyncio.wait_for(self._p2p.shutdown(), 10)
            except Exception:
                logger.debug("p2pd shutdown failed", exc_info=True)
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

    def __enter__(self) -> Swarm:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- sync API ---------------------------------------------------------------------------------
    def _run(self, coro, timeout: float):
        if not self._started or self._closed or self._loop is None:
            coro.close()
            raise SwarmError("the swarm transport is not running (call start() first)")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("synchronous Swarm methods must not be called from the transport thread")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise SwarmError(f"swarm transport did not answer within {timeout:.0f} s") from None

    @property
    def peer_id(self) -> str:
        if self._peer_id is None:
            raise SwarmError("peer id is known after start()")
        return self._peer_id

    def visible_maddrs(self) -> list[str]:
        """Full multiaddrs (with /p2p/<peer id>) others can bootstrap from; non-loopback ones first."""
        async def get():
            return [str(m) for m in await self._p2p.get_visible_maddrs(latest=True)]
        return sorted(self._run(get(), 10), key=_is_loopback)

    def publish(self, round: int, policy_version: int) -> None:
        """(Re)publish our record now (it is also republished every record_ttl_s / 3)."""
        with self._lock:
            self._round, self._policy_version = int(round), int(policy_version)
        self._run(self._astore_record(), DHT_OP_TIMEOUT_S + 5)

    def offer(self, round: int, policy_version: int, data: bytes, digest: str) -> None:
        """Serve ``data`` (sha256 ``digest``) to fetchers, keeping the newest ``max_offers``; publish."""
        data = bytes(data)
        if len(data) > self.settings.max_packet_bytes:
            raise ValueError(f"packet of {len(data)} bytes exceeds max_packet_bytes")
        if packet_digest(data) != digest:
            raise ValueError("digest does not match sha256 of the data")
        with self._lock:
            self._offers[digest] = (int(round), data)
            self._offers.move_to_end(digest)
            while len(self._offers) > self.settings.max_offers:
                self._offers.popitem(last=False)
        self.publish(round, policy_version)

    def peers(self) -> list[PeerInfo]:
        """Live, validated records of this run's other peers ([] if the DHT lookup fails)."""
        return self._run(self._apeers(DHT_OP_TIMEOUT_S), DHT_OP_TIMEOUT_S + 5)

    def fetch(self, peer_id: str, digest: str) -> bytes | None:
        """One packet from ``peer_id``; None on timeout/refusal/oversize/mismatch (see ``stats``)."""
        t = self.settings.fetch_timeout_s
        data, _ = self._run(self._afetch(peer_id, digest, t), t + 5)
        return data

    def collect(self, want_rounds: Callable[[int], bool] | Container[int], seen: set[str], min_packets: int,
                deadline_s: float, poll_s: float = 0.25,
                peer_filter: Callable[[PeerInfo], bool] | None = None, dropped: Counter | None = None,
                count_peers: bool = False, newest: int | None = None) -> list[Received]:
        """Fetch offered packets of wanted rounds whose digest is not in ``seen`` (digests of received
        packets are added to it) until ``min_packets`` new ones (from as many distinct peers, with
        ``count_peers``) arrived or ``deadline_s`` passed, or (given ``newest``, the newest wanted round)
        when every peer is past the wanted rounds with nothing left to offer.
        ``peer_filter`` defaults to "same protocol version as ours". Offers refused by the per-peer
        limits (``swarm_fetch.collect_offers``) are counted by reason in ``dropped``."""
        wanted = want_rounds if callable(want_rounds) else want_rounds.__contains__
        keep = peer_filter or (lambda p: p.protocol == self.protocol)
        declared: dict[tuple[str, str], int] = {}

        async def list_peers(timeout: float) -> list[PeerInfo]:
            peers = await self._apeers(timeout)
            declared.update(((p.peer_id, d), size) for p in peers for _, d, size in p.offers)
            return peers

        async def fetch(peer_id: str, digest: str, timeout: float) -> tuple[bytes | None, str]:
            # a peer may not send more than it announced: the declared size is the byte limit
            return await self._afetch(peer_id, digest, timeout, declared.get((peer_id, digest)))

        self._bound_memory()
        coro = collect_offers(
            list_peers, fetch, wanted=wanted, keep=keep, skip=lambda p, d: (p, d) in self._bad, seen=seen,
            min_packets=min_packets, deadline_s=deadline_s, poll_s=poll_s, fetch_timeout_s=self.settings.fetch_timeout_s,
            max_packet_bytes=self.settings.max_packet_bytes, max_parallel=MAX_PARALLEL_FETCHES,
            lookup_timeout_s=DHT_OP_TIMEOUT_S, max_peer_packets=self.settings.max_peer_packets,
            max_peer_bytes=self.settings.max_peer_bytes, taken=self._taken, dropped=dropped, counted=self._counted,
            count_peers=count_peers, newest=newest)
        return self._run(coro, max(0.0, deadline_s) + DHT_OP_TIMEOUT_S + 10)

    def distrust(self, peer_id: str, digest: str) -> None:
        """Never fetch ``digest`` from ``peer_id`` again (e.g. it served another peer's packet)."""
        if len(self._bad) < MAX_REMEMBERED:
            self._bad.add((peer_id, digest))

    def _bound_memory(self) -> None:
        """Per-peer bookkeeping stays bounded whatever peers offer: oldest entries go first."""
        while len(self._taken) > MAX_REMEMBERED:
            self._taken.popitem(last=False)
        if len(self._counted) > MAX_REMEMBERED:
            self._counted.clear()

    # ---- discovery ----------------------------------------------------------------------------------
    def _warn_alone(self) -> None:
        logger.warning("none of the %d initial peers answered; running alone and retrying every %.0f s",
                       len(self._initial), self.settings.bootstrap_retry_s)

    async def _bootstrap_once(self) -> bool:
        self.stats["bootstrap_attempts"] += 1

        async def one(pid: PeerID, maddr: Multiaddr) -> bool:
            if str(pid) == self._peer_id:
                return False
            try:  # P2P.create(initial_peers=...) would make p2pd exit when they are down, so dial here
                await asyncio.wait_for(self._p2p._client.connect(pid, [maddr]), CONNECT_TIMEOUT_S)
                return await self._dht.protocol.call_ping(pid) is not None
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
        while True:
            await asyncio.sleep(self.settings.bootstrap_retry_s)
            if not self._initial or self._dht.protocol.routing_table.uid_to_peer_id:
                continue
            if await self._bootstrap_once():
                logger.info("joined the swarm through an initial peer")
                await self._astore_record()
            else:
                self._warn_alone()

    async def _republish_loop(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.settings.record_ttl_s / 3))
            await self._astore_record()

    async def _astore_record(self) -> None:
        async with self._publish_lock:
            with self._lock:
                offers = [(r, d, len(data)) for d, (r, data) in self._offers.items()]
                rnd, pv = self._round, self._policy_version
            record = make_record(self._peer_id, self.model_id, self.tokenizer, self.protocol, rnd, pv,
                                 offers, time.time())
            try:
                ok = await asyncio.wait_for(self._dht.store(
                    self._key, record, time.time() + self.settings.record_ttl_s,
                    subkey=self._validator.local_public_key), DHT_OP_TIMEOUT_S)
            except Exception as e:
                logger.debug("record store failed: %r", e)
                ok = False
            self.stats["records_published" if ok else "publish_failures"] += 1

    async def _apeers(self, timeout: float) -> list[PeerInfo]:
        try:
            found = await asyncio.wait_for(self._dht.get(self._key, latest=True), timeout)
        except Exception as e:
            logger.debug("peers lookup failed: %r", e)
            return []
        if found is None or not isinstance(found.value, dict):
            return []
        now, best = time.time(), {}
        for item in found.value.values():
            if item.expiration_time < now:
                continue
            try:
                info = parse_record(item.value)
            except RecordError:
                self.stats["records_rejected"] += 1
                continue
            if info.peer_id != self._peer_id and (
                    info.peer_id not in best or best[info.peer_id].updated_at < info.updated_at):
                best[info.peer_id] = info
        return sorted(best.values(), key=lambda p: p.peer_id)

    # ---- fetch ----------------------------------------------------------------------------------------
    def _lookup(self, digest: str) -> bytes | None:
        with self._lock:
            entry = self._offers.get(digest)
        return entry[1] if entry is not None else None

    async def _afetch(self, peer_id: str, digest: str, timeout: float,
                      max_bytes: int | None = None) -> tuple[bytes | None, str]:
        """(data, "ok") or (None, reason); the bytes come from ``peer_id`` over an authenticated stream.
        ``max_bytes`` (at most ``settings.max_packet_bytes``) bounds what the peer may send."""
        limit = self.settings.max_packet_bytes if max_bytes is None else min(max_bytes, self.settings.max_packet_bytes)
        try:
            pid = PeerID.from_base58(peer_id)
        except Exception:
            return None, STATUS_BAD_REQUEST
        if not is_digest(digest):
            return None, STATUS_BAD_REQUEST
        writer = None

        async def transfer() -> tuple[bytes | None, str]:
            nonlocal writer
            info, reader, writer = await self._open_stream(pid)
            if info.peer_id != pid:
                return None, ERROR
            return await request_packet(reader, writer, self.settings.run_id, digest, limit)

        try:
            data, reason = await asyncio.wait_for(transfer(), max(0.01, timeout))
        except asyncio.TimeoutError:
            data, reason = None, TIMEOUT
        except Exception as e:
            logger.debug("fetch %s from %s failed: %r", digest, peer_id, e)
            data, reason = None, ERROR
        finally:
            if writer is not None:
                writer.close()
        if data is None:
            self.stats["fetch_failures"] += 1
            key = {TIMEOUT: "fetch_timeouts", STATUS_NOT_FOUND: "fetch_not_found", STATUS_BUSY: "fetch_busy",
                   OVERSIZE: "fetch_oversize", MISMATCH: "digest_mismatches"}.get(reason)
            if key:
                self.stats[key] += 1
            if reason == MISMATCH or (reason == OVERSIZE and max_bytes is not None):
                logger.warning("peer %s served %s for %s; ignoring that offer", peer_id,
                               "bytes that do not match" if reason == MISMATCH else "more bytes than it announced", digest)
                self.distrust(peer_id, digest)
        else:
            self.stats["bytes_in"] += len(data)
            self.stats["packets_in"] += 1
        return data, reason

    async def _open_stream(self, pid: PeerID) -> tuple[StreamInfo, asyncio.StreamReader, asyncio.StreamWriter]:
        # = P2P.call_binary_stream_handler, but closes the p2pd control socket when opening fails or is cancelled
        reader, writer = await self._p2p._client.control.daemon_connector.open_connection()
        try:
            await write_pbmsg(writer, p2pd_pb2.Request(type=p2pd_pb2.Request.STREAM_OPEN, streamOpen=(
                p2pd_pb2.StreamOpenRequest(peer=pid.to_bytes(), proto=[FETCH_PROTOCOL]))))
            response = p2pd_pb2.Response()
            await read_pbmsg_safe(reader, response)
            raise_if_failed(response)
            return StreamInfo.from_protobuf(response.streamInfo), reader, writer
        except BaseException:
            writer.close()
            raise

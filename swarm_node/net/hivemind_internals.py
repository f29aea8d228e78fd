"""hivemind internals: every use of a hivemind attribute that is not public API, one small function each.

So that a hivemind upgrade has one place to check. Tested with hivemind 1.1.12 (pyproject.toml
pins 1.1.x). Used by the transport's modules in `net/` (and the red team's DHT attacker).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.dht.node import DHTNode
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.p2p import P2P, PeerID
from hivemind.p2p.p2p_daemon_bindings.datastructures import StreamInfo
from hivemind.p2p.p2p_daemon_bindings.utils import raise_if_failed, read_pbmsg_safe, write_pbmsg
from hivemind.proto import dht_pb2, p2pd_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

MAX_FIND_KEYS = 32  # keys in one find request (a node reads its run's 8 membership keys at once)
MAX_STORE_ENTRIES = 16  # entries in one store request (a node stores its one record at a time)


def wrap_rsa_key(key: rsa.RSAPrivateKey) -> RSAPrivateKey:
    """hivemind's key type around a `cryptography` key: it has no from_bytes(), so mirror its
    __setstate__ (private `RSAPrivateKey._private_key`)."""
    wrapped = RSAPrivateKey.__new__(RSAPrivateKey)
    wrapped._private_key = key
    return wrapped


def p2pd_pid(p2p: P2P) -> int | None:
    """pid of the p2pd child process (private `P2P._child`)."""
    return p2p._child.pid if p2p._child is not None else None


async def dial(p2p: P2P, pid: PeerID, maddrs: Multiaddr | list[Multiaddr]) -> None:
    """Connect to a peer at known addresses, tried by p2pd in turn (private `P2P._client`).
    P2P.create(initial_peers=...) would make p2pd exit when those peers are down, so bootstrap
    peers are dialled here."""
    await p2p._client.connect(pid, maddrs if isinstance(maddrs, list) else [maddrs])


class NodeP2P(P2P):
    """`P2P` with two p2pd flags hivemind does not expose (private `P2P._make_process_args`):

    Noise only (`-tls=0`): a stranger picks the handshake whose answer costs us most. With TLS 1.3 it can offer
        only P-521 for the key exchange (slow in Go 1.20): 7.7-8.2 ms of p2pd for a ClientHello built once, and a
        full handshake with P-521 keys 20.7 ms (red team 29). Noise has one fixed curve (X25519) and costs one
        signature of our identity key, RSA-2048: 2.0-2.5 ms (`bench/handshake_cost.py`). A dialer offering
        /tls/1.0.0 first is told `na` and goes on with /noise.
    static relays (`-relayDiscovery=0` with autorelay): hivemind leaves p2pd's relay discovery on, which feeds
        the trusted relays through libp2p's peer-source path: that waits for 4 candidates or a 3-minute boot delay
        before its first reservation; static relays reserve within a second.
    """

    @staticmethod
    def _make_process_args(*args, **kwargs) -> list[str]:
        if kwargs.get("autoRelay"):
            kwargs["relayDiscovery"] = False
        return P2P._make_process_args(*args, **{**kwargs, "tls": False})


async def ping(dht: DHTNode, pid: PeerID) -> bool:
    """One DHT ping RPC, which also adds the peer to our routing table (`DHTNode.protocol`)."""
    return await dht.protocol.call_ping(pid) is not None


def has_routes(dht: DHTNode) -> bool:
    """Whether the DHT routing table knows any peer (`DHTNode.protocol.routing_table`)."""
    return bool(dht.protocol.routing_table.uid_to_peer_id)


class CappedStorage(DHTLocalStorage):
    """hivemind's local DHT storage, but every dictionary value keeps at most `max_entries` subkeys
    (those expiring last; `TimedStorage.maxsize` evicts the earliest-expiring)."""

    def __init__(self, max_entries: int):
        super().__init__()
        self.max_entries = max_entries

    def store_subkey(self, key, subkey, value, expiration_time) -> bool:
        ok = super().store_subkey(key, subkey, value, expiration_time)
        entry = self.get(key)
        if entry is not None and isinstance(entry.value, DictionaryDHTValue):
            entry.value.maxsize = self.max_entries  # set when the dictionary is created: later stores trim it
        return ok


class NoStorage(DHTLocalStorage):
    """A storage that keeps nothing: every store is refused (answered `store_ok = False`)."""

    def store(self, key, value, expiration_time) -> bool:
        return False

    def store_subkey(self, key, subkey, value, expiration_time) -> bool:
        return False


def cap_dictionary_values(dht: DHTNode, max_entries: int) -> None:
    """Make `dht` keep at most `max_entries` subkeys per dictionary value it holds, on every path a
    peer can store through. hivemind has two: `rpc_store` puts a request with `in_cache = True` in
    `DHTNode.protocol.cache`, a second storage that `rpc_find` serves too, with no cap. Our DHT never
    caches (cache_locally=False, cache_nearest=0), so that storage refuses every store. Replaces the
    private `protocol.storage` and `protocol.cache`, both empty right after `DHTNode.create`."""
    dht.protocol.storage = CappedStorage(max_entries)
    dht.protocol.cache = NoStorage()


async def create_dht(p2p: P2P, validator, wait_timeout: float, client_mode: bool) -> DHTNode:
    """A DHTNode that never caches what it finds (a holder serves only what it stores, and it never sends a store
    of a whole dictionary, which `guard_dht_requests` refuses). It reads peers' dictionary values with
    `hivemind_hardening.BoundedDHTSerializer`, the protocol's class default once `harden_hivemind` has run (it runs
    before p2pd starts, so before any DHT exists)."""
    return await DHTNode.create(p2p=p2p, record_validator=validator, wait_timeout=wait_timeout, num_workers=2,
                                client_mode=client_mode, cache_locally=False, cache_nearest=0, cache_on_store=False)


def guard_dht_requests(p2p: P2P, allow: Callable[[str, int], bool]) -> None:
    """Refuse a DHT request before its bytes are parsed when `allow(peer id, request bytes)` says no:
    every `DHTProtocol.rpc_*` handler registered on `p2p` is wrapped (private
    `P2P._client.control.unary_handlers`, which hivemind reads on every call). A refused request is
    answered with an error, at the cost of a length check (the verify bomb sent 3.8 MB requests of
    2,400 records each, 8 at once, and every record's owner key was parsed on the event loop)."""
    handlers = p2p._client.control.unary_handlers
    for name, handler in list(handlers.items()):
        if name.startswith("DHTProtocol."):
            async def guarded(request: bytes, remote_id: PeerID, handler=handler, name=name) -> bytes:
                if not allow(str(remote_id), len(request)):
                    raise PermissionError("refused: over this peer's DHT request rate or size")
                problem = dht_request_problem(name, request)
                if problem is not None:
                    raise PermissionError(f"refused: {problem}")
                return await handler(request, remote_id)
            handlers[name] = guarded


def dht_request_problem(name: str, request: bytes) -> str | None:
    """Why a store or find request is refused before hivemind handles it (None: it is not). A store entry tagged as
    a whole dictionary value is unpacked by `DHTProtocol.rpc_store` with hivemind's own reader before any validator
    (~60 ms for 64 KiB of lying lengths: red team 17); our nodes store one subkey at a time and never cache, so they
    never send one. A find of 2,977 keys in 64 KiB cost 155 ms and a 3.5 MB answer (red team 19). An unparsable
    request is left to hivemind, which refuses it."""
    try:
        if name.endswith(".rpc_store"):
            store = dht_pb2.StoreRequest.FromString(request)
            if len(store.keys) > MAX_STORE_ENTRIES:
                return f"a store of {len(store.keys)} entries (at most {MAX_STORE_ENTRIES})"
            if DHTProtocol.IS_DICTIONARY in store.subkeys:
                return "a store of a whole dictionary value"
        elif name.endswith(".rpc_find"):
            keys = len(dht_pb2.FindRequest.FromString(request).keys)
            if keys > MAX_FIND_KEYS:
                return f"a find of {keys} keys (at most {MAX_FIND_KEYS})"
    except Exception:
        return None
    return None


def is_old_version(error: Exception) -> bool:
    """A stream-open error saying the peer does not speak the protocol (p2pd's multistream refusal)."""
    return "protocols not supported" in str(error)


async def _control(p2p: P2P, request: p2pd_pb2.Request) -> tuple[p2pd_pb2.Response, asyncio.StreamReader,
                                                                   asyncio.StreamWriter]:
    """One request to p2pd on a control connection of its own (private `P2P._client.control.daemon_connector`),
    its response read and checked; the connection is closed when that fails or is cancelled, else left to the caller."""
    reader, writer = await p2p._client.control.daemon_connector.open_connection()
    try:
        await write_pbmsg(writer, request)
        response = p2pd_pb2.Response()
        await read_pbmsg_safe(reader, response)
        raise_if_failed(response)
        return response, reader, writer
    except BaseException:
        writer.close()
        raise


async def open_stream(p2p: P2P, pid: PeerID, proto: str | tuple[str, ...]) -> tuple[StreamInfo, asyncio.StreamReader,
                                                                                     asyncio.StreamWriter]:
    """= P2P.call_binary_stream_handler, but closes the p2pd control socket when opening fails or
    is cancelled (`_control`). Several protocol ids: p2pd's multistream-select offers them in order and the stream
    speaks the first the peer supports (`StreamInfo.proto` says which)."""
    protos = [proto] if isinstance(proto, str) else list(proto)
    response, reader, writer = await _control(p2p, p2pd_pb2.Request(
        type=p2pd_pb2.Request.STREAM_OPEN, streamOpen=p2pd_pb2.StreamOpenRequest(peer=pid.to_bytes(), proto=protos)))
    try:
        return StreamInfo.from_protobuf(response.streamInfo), reader, writer
    except BaseException:
        writer.close()
        raise


async def conn_manager(p2p: P2P, kind: int, pid: PeerID | None = None, tag: str | None = None,
                       weight: int | None = None, timeout_s: float = 5.0) -> None:
    """One request to p2pd's connection manager (`p2pd_pb2.ConnManagerRequest.TAG_PEER`, `UNTAG_PEER` or `TRIM`;
    hivemind has no call for it)."""
    fields = {"peer": pid.to_bytes() if pid is not None else None, "tag": tag, "weight": weight}
    request = p2pd_pb2.ConnManagerRequest(type=kind, **{k: v for k, v in fields.items() if v is not None})
    async with asyncio.timeout(timeout_s):
        _, _, writer = await _control(p2p, p2pd_pb2.Request(type=p2pd_pb2.Request.CONNMANAGER, connManager=request))
    writer.close()


def dht_size_estimate(dht: DHTNode) -> float:
    """Kademlia's estimate of how many nodes the DHT has, from the XOR distance to our k nearest
    known neighbors: N ~ k * 2^160 / d_k (private `DHTNode.protocol.routing_table`). Within a factor
    of ~2 once the table is filled around our id (bootstrap looks up our own id); counts every DHT
    node, of any run. One node id per peer id (its latest): a peer claims its node id in every request, and
    one that claimed 20 ids next to ours made N ~1e42 and our membership writes stop (red team 9)."""
    table = dht.protocol.routing_table
    near = [(uid, peer) for uid, peer in table.get_nearest_neighbors(dht.node_id, k=4 * table.bucket_size,
                                                                     exclude=dht.node_id)
            if table.peer_id_to_uid.get(peer) == uid][:table.bucket_size]
    if len(near) < table.bucket_size:
        return float(len(near) + 1)  # a small DHT: we know all of it
    farthest = max(dht.node_id.xor_distance(node_id) for node_id, _ in near)
    return len(near) * 2.0 ** (8 * len(dht.node_id.to_bytes())) / max(1, farthest)

"""Lanes: stream protocol ids of their own for each neighbour, and a shield for the public ones (issue 27).

A stream the node refuses still costs it ~0.35 ms (`bench/stream_cost.py`): p2pd accepts it and hands it
to our handler, whose Python runs beside the trainer; only a protocol id the node has not registered is
refused inside p2pd (~0.07 ms, none of it ours). One id flooding valid announcements cost 40 % of a
node's rounds even after it was graylisted. So the node registers as little as it can afford to:

    lane    each neighbour reaches us on ids of its own, <public id> + "/lane/" + 32 hex digits (an HMAC
            of its peer id under a key derived from our identity key: the same after a restart) for
            announcements and fetches, which we tell it in the announcements we send it (field `lane`) and
            keep registered in p2pd while it is our neighbour and LANE_LINGER_S after (a graylisted one loses it
            at once, so its streams then die in p2pd). Each id registered or removed is an identify push from
            p2pd to every connected peer (~0.2 ms of our p2pd per peer, red team 24): a candidate we dial is
            told its lane but gets it registered only once it answers `ok`, and new lanes are budgeted
            (LANE_RATE a second, LANE_BURST at once; beyond, the peer uses the public ids). The ids are
            not secret (libp2p identify lists every registered id to every connected peer, red team 21): a
            stream on a lane from any other id is closed unread and counts as that id's misbehaviour, but
            it costs what any registered id's stream costs, so a flooder that reads identify and floods a
            lane costs the node what the flood on the public ids did before (see docs/RELIABILITY.md)
    shield  SHIELD_TRIGGER streams on the public ids (announcement, fetch) within SHIELD_WINDOW_S,
            served or not, unregister them for a while (`shield.py`): strangers cannot reach us meanwhile
            (they see the refusal an older node gives and retry later), neighbours go on over their lanes,
            and we still dial the candidates we pick

Both sides are optional: a peer that sends no `lane` is reached on the public ids, and one that ignores ours
still uses them (protocol/SPEC.md section 11).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from swarm_node.net.scores import TokenBucket
from swarm_node.net.shield import Shield

logger = logging.getLogger(__name__)

LANE_INFIX = "/lane/"  # a lane's id: the kind's first public id + LANE_INFIX + the token
LANE_HEX = 32  # hex digits of a lane token (an id, not a secret: identify shows it; the peer check guards it)
SHIELD_TRIGGER = 200  # streams on the public ids within SHIELD_WINDOW_S that raise the shield (served or not:
SHIELD_WINDOW_S = 2.0  # a stranger's few a second and a neighbour's before it learns its lane stay far below)
MAX_THEIRS = 256  # peers whose lane for us we remember (our neighbours and the candidates we dial)
# new lanes a second and at once (a node dials D + 2 at its start): made-up candidates and ids that join and leave in
# turn made 12 id changes a second, 0.1 core of p2pd with 48 peers connected (red team 24); beyond, the public ids
LANE_RATE, LANE_BURST = 0.5, 8.0
LANE_LINGER_S = 30.0  # a lane outlives its peer's slot this long (one that leaves and comes back changes nothing)

Handler = Callable[[object, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]  # (stream info, r, w)


@dataclass(frozen=True)
class Kind:
    """One stream protocol the node serves: its public ids (the first names its lanes) and its handler."""

    ids: tuple[str, ...]
    serve: Handler


def lane_token(obj: dict) -> str | None:
    """The lane a peer gave us in an announcement frame (request or reply); None if absent or malformed."""
    token = obj.get("lane")
    if isinstance(token, str) and len(token) == LANE_HEX and all(c in "0123456789abcdef" for c in token):
        return token
    return None


async def register_plainly(p2p, kinds: dict[str, Kind]) -> None:
    """Discovery v1 (no lanes, no shield): every kind's public ids, as they are."""
    for kind in kinds.values():
        for proto in kind.ids:
            await p2p.add_binary_stream_handler(proto, kind.serve)


class Lanes:
    """Which stream ids this node registers in p2pd: the public ones of every kind unless shielded, and each
    neighbour's lanes; and the lanes peers gave us. Runs on the transport's loop."""

    def __init__(self, p2p, kinds: dict[str, Kind], secret: bytes | None = None,
                 misused: Callable[[str], None] = lambda sender: None, clock: Callable[[], float] = time.monotonic):
        self.p2p, self.kinds, self.misused = p2p, kinds, misused  # misused(sender): it opened another's lane
        # tokens stable across restarts when `secret` is (our identity key): a restarted node's neighbours still
        # know its lanes, and it theirs as soon as it dials them
        self.secret = hashlib.sha256(b"swarm-node lanes\0" + secret).digest() if secret else os.urandom(32)
        self.open: dict[str, list[str]] = {}  # peer -> the lane ids registered for it
        self.unwanted: dict[str, float] = {}  # peer -> since when it holds a lane it is no neighbour for
        self.budget, self.clock = TokenBucket(LANE_RATE, LANE_BURST, clock), clock  # new lanes
        self.theirs: OrderedDict[str, str] = OrderedDict()  # peer -> the lane token it gave us
        self.theirs_unwanted: dict[str, float] = {}  # peer -> since when we keep its lane though it is no neighbour
        self.lock = asyncio.Lock()  # one p2pd handler change at a time (registering an id twice fails)
        self.public: set[str] = set()  # the public ids registered now (none while the shield is up)
        self.tasks: set[asyncio.Task] = set()  # lanes being opened or closed in the background
        self.shield = Shield("stream", SHIELD_TRIGGER, SHIELD_WINDOW_S, self._close_public, self._open_public)

    def token(self, peer: str) -> str:
        return hmac.new(self.secret, peer.encode(), hashlib.sha256).hexdigest()[:LANE_HEX]

    async def listen(self) -> None:
        await self._open_public()

    async def give(self, peer: str) -> dict:
        """The field that tells `peer` its lane, once its ids are registered (`open` follows p2pd id by id, so a
        registration that failed half-way is completed next time, never registered twice); {} past the budget."""
        async with self.lock:
            if peer not in self.open and not self.budget.take():
                return {}
            ids, token = self.open.setdefault(peer, []), self.token(peer)
            for kind in self.kinds.values():
                if kind.ids[0] + LANE_INFIX + token not in ids:
                    await self.p2p.add_binary_stream_handler(kind.ids[0] + LANE_INFIX + token,
                                                             self._lane_handler(kind.serve, peer))
                    ids.append(kind.ids[0] + LANE_INFIX + token)
        return {"lane": token}

    def want(self, peer: str) -> dict:
        """= give, registering in the background (a peer that uses the lane before then falls back to the public ids);
        {} past the budget."""
        if peer not in self.open:
            if not self.budget.take():
                return {}
            self.open[peer] = []  # paid for: give registers its ids
            self._soon(self.give, peer)
        return {"lane": self.token(peer)}

    def _soon(self, change, peer: str) -> None:
        async def quietly() -> None:
            try:
                await change(peer)
            except Exception as e:  # p2pd gone (closing): a peer without its lane falls back to the public ids
                logger.debug("lane of %s: %r", peer, e)
        task = asyncio.get_running_loop().create_task(quietly())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def keep(self, wanted: Callable[[], set[str]]) -> None:
        """LANE_LINGER_S after a peer stops being in `wanted()`, forget the lane it gave us (a restart finds it meanwhile)
        and unregister ours for it (`wanted()` read again under the lock: a peer admitted meanwhile keeps the lane it
        was just told)."""
        now, want = self.clock(), wanted()
        for peer in self._lingered(self.theirs_unwanted, self.theirs, want, now):
            del self.theirs[peer], self.theirs_unwanted[peer]
        for peer in self._lingered(self.unwanted, self.open, want, now):
            await self.close(peer, unless=lambda p: p in wanted())

    @staticmethod
    def _lingered(since: dict[str, float], held, want: set[str], now: float) -> list[str]:
        """The peers in `held` not in `want` for LANE_LINGER_S; `since` (when each stopped being wanted) kept up to date."""
        for peer in [p for p in since if p in want or p not in held]:  # back in time, or forgotten already
            del since[peer]
        return [p for p in held if p not in want and now - since.setdefault(p, now) >= LANE_LINGER_S]

    def close_soon(self, peer: str) -> None:
        """= close, in the background (a graylisting: its streams die in p2pd from now on)."""
        try:
            self._soon(self.close, peer)
        except RuntimeError:  # no loop (a unit test of the mesh): nothing is registered
            pass

    async def close(self, peer: str, unless: Callable[[str], bool] = lambda peer: False) -> None:
        async with self.lock:
            if unless(peer):  # decided under the lock: no lane is given meanwhile
                return
            ids = self.open.get(peer, [])
            while ids:
                await self.p2p.remove_binary_stream_handler(ids[-1])
                ids.pop()
            self.open.pop(peer, None)
            self.unwanted.pop(peer, None)

    def heard(self, peer: str, obj: dict) -> None:
        """Remember the lane a neighbour gave us in an `ok` frame, or forget it (a frame without one: it keeps none
        for us). Only a neighbour's: strangers' junk frames flushed a neighbour's lane from the map (red team 21)."""
        token = lane_token(obj) if isinstance(obj, dict) else None
        self.theirs.pop(peer, None)
        self.theirs_unwanted.pop(peer, None)
        if token is not None:
            self.theirs[peer] = token
            while len(self.theirs) > MAX_THEIRS:
                self.theirs.popitem(last=False)

    def remember(self, saved: dict[str, object]) -> None:
        """The lanes our anchors gave us before a restart (`scores.anchor_lanes`): they keep it LANE_LINGER_S after
        losing us, so a quick restart reaches them on it, past a shield on their public ids (red team 26: 11 s)."""
        for peer, token in list(saved.items())[:MAX_THEIRS]:
            if lane_token({"lane": token}) is not None and peer not in self.theirs:
                self.theirs[peer] = token

    def protocols(self, peer: str, kind: str) -> tuple[str, ...]:
        """The ids to reach `peer` on for `kind`, in order: its lane for us if it gave one, then the public ones."""
        ids, token = self.kinds[kind].ids, self.theirs.get(peer)
        return (ids[0] + LANE_INFIX + token, *ids) if token else ids

    def _lane_handler(self, serve: Handler, peer: str) -> Handler:
        async def lane(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if str(info.peer_id) != peer:  # a lane serves its peer only (any connected peer can read the id: identify)
                writer.close()
                self.misused(str(info.peer_id))
                return
            await serve(info, reader, writer)
        return lane

    def _public_handler(self, serve: Handler) -> Handler:
        async def public(info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.shield.arrived()
            await serve(info, reader, writer)
        return public

    async def _close_public(self) -> None:
        async with self.lock:
            for proto in [p for kind in self.kinds.values() for p in kind.ids if p in self.public]:
                await self.p2p.remove_binary_stream_handler(proto)
                self.public.discard(proto)

    async def reconcile(self) -> None:
        """Register the public ids p2pd lacks while no shield is up (a reopen that failed left them shut; arrivals,
        which raise and lower the shield, come only on registered ids: red team 23)."""
        if self.shield.task is None and len(self.public) < sum(len(kind.ids) for kind in self.kinds.values()):
            await self._open_public()

    async def _open_public(self) -> None:
        async with self.lock:
            for kind in self.kinds.values():
                for proto in [p for p in kind.ids if p not in self.public]:
                    await self.p2p.add_binary_stream_handler(proto, self._public_handler(kind.serve))
                    self.public.add(proto)

"""What a hostile swarm peer is made of: the parts adversary.py (the tests' attacker) and poisoner.py
(the benchmarks' poisoner) share. Both are real peers on real libp2p that speak the protocol.

    HostileTransport   a HivemindTransport whose shelf announces any (round, digest, size) offers,
                       sizes and digests that may lie, serves any bytes, and counts every request
    PublicModel        the attacker's copy of the victim's round-0 model (the public warm start):
                       policy, task, tokenizer fingerprint, and packets signed with our peer id
    Crowd              several HostileTransports of one attacker process (Sybil ids) seen as one peer
    honest_rounds      follow the honest peers' rounds as they announce them, until they are gone
    run_peer           start the transport(s), run an attack, keep its JSON summary (Summary), stop
                       cleanly on SIGTERM

None of this is used by a node: an honest node serves only what it offers (net/fetch.py `Offers`).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

from swarm_node.config import SwarmConfig
from swarm_node.fsutil import write_json_atomic
from swarm_node.net import PeerInfo, SwarmError
from swarm_node.net.fetch import Offers
from swarm_node.net.hivemind import HivemindTransport

GONE_S = 20.0  # no other peer seen for this long: they all left


class Shelf(Offers):
    """Offers as a hostile peer keeps them: after `show()` it announces exactly `offers` and serves
    `table` (each may lie about the other); every request is counted per digest in `served`."""

    def __init__(self, keep: int):
        super().__init__(keep)
        self.offers: list[tuple[int, str, int]] | None = None  # None: the honest offers (Offers.add)
        self.table: dict[str, bytes] = {}
        self.served: Counter = Counter()

    def show(self, offers: list[tuple[int, str, int]], table: dict[str, bytes]) -> None:
        self.offers, self.table = list(offers), dict(table)

    def get(self, digest: str) -> bytes | None:
        self.served[digest] += 1
        return super().get(digest) if self.offers is None else self.table.get(digest)

    def announced(self) -> list[tuple[int, str, int]]:
        return super().announced() if self.offers is None else list(self.offers)


class HostileTransport(HivemindTransport):
    """A HivemindTransport that serves from a `Shelf` (see `shelf.show`)."""

    def __init__(self, cfg: SwarmConfig, **kw):
        super().__init__(cfg, **kw)
        self.shelf = self._offers = Shelf(cfg.max_offers)


class PublicModel:
    """The public warm-started model at `model`, the task, our tokenizer fingerprint and peer id."""

    def __init__(self, model: str, task_options: str, run_id: str, peer_id: str):
        import torch

        from swarm_node.config import ModelConfig
        from swarm_node.tasks import load_task
        from swarm_node.train.policy import Policy
        from swarm_node.wire.codec import tokenizer_fingerprint

        torch.set_num_threads(1)
        self.policy = Policy.load(ModelConfig(name=model))
        self.task = load_task("arith", None, **json.loads(task_options))
        self.tokenizer = tokenizer_fingerprint(self.policy.tokenizer)
        self.run_id, self.peer_id = run_id, peer_id

    def scheduled(self, r: int, k: int, sender: str | None = None) -> list:
        """The first `k` train examples of `sender`'s (default: our) public schedule for round `r`: the
        only problems a receiver trains on from that id (SPEC 14.5), so every attack picks among them."""
        from swarm_node.train.rollout import round_examples
        from swarm_node.wire.schedule import schedule_key

        return round_examples(self.task, r, k, schedule_key(self.run_id, "vertical", sender or self.peer_id))

    def packet(self, r: int, groups, **changes):
        """A Packet of round `r` from us (fields overridden by `changes`, e.g. a forged sender)."""
        from swarm_node.wire.codec import Packet

        fields = dict(run_id=self.run_id, sender=self.peer_id, model_id=self.policy.model_id, tokenizer=self.tokenizer,
                      policy_version=r, round=r, mode="vertical", groups=groups)
        return Packet(**{**fields, **changes})


class Crowd:
    """An attacker's ids (one HostileTransport each, `swarms[0]` first) as one peer for honest_rounds: the
    peers any of them knows of, our own ids left out, each at the newest round any of them heard
    (an id the victim evicted stops hearing it; the others still do)."""

    def __init__(self, swarms: list[HostileTransport]):
        self.swarms, self.peer_id = swarms, swarms[0].peer_id
        self.ours = {s.peer_id for s in swarms}

    def peers(self) -> list[PeerInfo]:
        newest: dict[str, PeerInfo] = {}
        for swarm in self.swarms:
            for p in swarm.peers():
                if p.peer_id not in self.ours and (p.peer_id not in newest or p.round > newest[p.peer_id].round):
                    newest[p.peer_id] = p
        return list(newest.values())


def honest_rounds(swarm: HivemindTransport | Crowd, t_end: float, follow: Callable = max, until_round: int = 10**9,
                  stale_s: float | None = None, keep: Callable[[PeerInfo], bool] = lambda p: True,
                  poll_s: float = 0.1) -> Iterator[tuple[int, list[PeerInfo]]]:
    """Yield (round, peers) each time the other peers' announced round (`follow` of theirs: max, or
    min where several attackers announce rounds ahead) moves past the last one yielded. Ends at
    `t_end`, at `until_round`, GONE_S after every other peer left, or `stale_s` after their round
    last advanced in our view (the honest nodes evict and refuse a neighbour that delivers nothing
    they accept, so what we last heard of them goes stale)."""
    last, seen_at, advanced_at = 0, time.monotonic(), time.monotonic()
    while time.monotonic() < t_end:
        peers = [p for p in swarm.peers() if p.peer_id != swarm.peer_id and keep(p)]
        if peers:
            seen_at = time.monotonic()
        elif time.monotonic() - seen_at > GONE_S:
            return
        if stale_s is not None and last >= 1 and time.monotonic() - advanced_at > stale_s:
            return
        r = follow((p.round for p in peers if p.round > 0), default=0)
        if r >= until_round:
            return
        if r <= last:
            time.sleep(poll_s)
            continue
        last, advanced_at = r, time.monotonic()
        yield r, peers


class Summary(dict):
    """An attack's JSON summary, rewritten atomically at `path` by `save()` with what the shelves served
    and the transports' counters (summed over the attacker's ids)."""

    def __init__(self, path: str | None, swarms: list[HostileTransport]):
        super().__init__()
        self.path, self.swarms = path, swarms

    def save(self) -> None:
        if self.path:
            served, stats = Counter(), Counter()
            for swarm in self.swarms:
                served.update(swarm.shelf.served)
                stats.update(swarm.stats())
            self.update(served=dict(served), stats=dict(stats))
            write_json_atomic(self.path, dict(self), durable=False)


def run_peer(cfg: SwarmConfig, attack: Callable[[list[HostileTransport], Summary], int], summary_path: str | None,
             model_id: str = "unset", ids: int = 1) -> int:
    """Start `ids` HostileTransports for `cfg` (a peer id each; announcing `model_id` until the attack
    sets its own), run `attack(swarms, summary)` with those that started and return its exit code. The
    summary is saved at the end, on SIGTERM too, and the transports closed."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally below: summary + clean shutdown
    swarms = [HostileTransport(cfg, model_id=model_id, tokenizer="unset") for _ in range(ids)]
    summary = Summary(summary_path, swarms)

    def start(swarm: HostileTransport) -> bool:  # on one overloaded core some ids miss a timeout: an attacker
        try:  # goes on with those that got in (one id alone must start)
            swarm.start()
            return True
        except SwarmError as e:
            if ids == 1:
                raise
            print(f"an id did not start ({e}); going on without it", file=sys.stderr, flush=True)
            swarm.close()
            return False
    try:
        with ThreadPoolExecutor(4) as pool:  # each start dials and waits: 64 one after another take minutes
            up = list(pool.map(start, swarms))
        swarms[:] = [s for s, ok in zip(swarms, up) if ok]
        if not swarms:
            raise SwarmError(f"none of the {ids} ids started")
        return attack(swarms, summary)
    finally:  # ending already (a TERM, --seconds, the honest peers gone): a TERM from here on, even one that comes
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # while the interpreter shuts down, must not make it exit -15
        summary.save()
        for swarm in swarms:
            swarm.close()

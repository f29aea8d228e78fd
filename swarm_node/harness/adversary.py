"""A hostile swarm peer, run as a real process by tests/test_reliability.py and bench/chaos.py.

It joins a run through `hostile.HostileTransport` (real libp2p, valid signed announcements) and
speaks the real protocol, but everything it offers is crafted to hurt. Every round of the honest
nodes (read from their records) it offers, in one record of up to 16 offers:

  * the round's *attack packet*, one kind per round, cycling through KINDS (below), built from
    real completions of its own model (rollout.generate_groups) and then tampered with;
  * a flood: FLOOD more valid packets for the same round (distinct digests);
  * a stale packet (round - 6), an offer whose declared size is far above any limit, an offer
    whose declared size is smaller than what it serves, and an offer whose bytes do not match
    its digest;
  * the attack packets of its previous two rounds (so a slow receiver can still take them).

Every served digest is counted, so the test can check that no digest is fetched twice by a peer.

    python -m swarm_node.harness.adversary --peers MADDR --run-id RUN --model tiny-s --summary out.json
    ... --mode stall      # offers packets, never answers a fetch
    ... --mode echo       # re-signs the honest peers' own packets as its own
    ... --mode amplify --group-size 64    # valid packets, 64 completions per group
    ... --mode streams --streams 10000    # holds fetch streams open to --peers[0]

Bounded: it exits after --seconds, after the honest peers reach --until-round, 20 s after they
all left, or on SIGTERM; the summary (--summary) is rewritten every round and at exit. It prints
`ADVERSARY <peer id>` once it is up.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import time
from collections import Counter

import numpy as np

from swarm_node.config import SwarmConfig
from swarm_node.harness.hostile import HostileTransport, PublicModel, Summary, honest_rounds, run_peer
from swarm_node.wire.codec import digest as packet_digest

STALE_S = 45.0  # no honest round advanced in our view for this long: we were evicted, or they are done
FLOOD = 8
# The attack of each round, in turn. Comments: what an honest receiver must do with it.
KINDS = (
    "logprob_zero",  # accepted (valid); log-prob 0 claims pi_gen = 1: deflates the IS weight, bounded by TIS
    "positive_logprob",  # rejected by the codec: codec_bad_logprob
    "unknown_example",  # rejected: unknown_example
    "impersonate",  # rejected: sender_mismatch (Packet.sender is an honest peer's id)
    "prompt_mismatch",  # rejected: prompt_mismatch (completions of one example under another's id)
    "held_out",  # rejected: held_out_example (a test-split id would leak the evaluation set)
    "logprob_low",  # accepted; log-prob -40 inflates pi/pi_gen: truncated at C, F-TIS drops A<0 ones (D huge)
    "replay",  # an honest peer's packet, re-served verbatim: sender_mismatch, then fetched from its sender
    "token_out_of_range",  # rejected by the codec: codec_token_out_of_range
    "truncated",  # rejected by the codec: codec_bad_msgpack
    "wrong_round",  # rejected: round_mismatch (packet round differs from the offer's)
    "too_long",  # rejected: too_long (longer completions than the receiver generates)
)


class Crafter(PublicModel):
    """Builds the packets: real groups from its own model, then tampered."""

    def __init__(self, args, peer_id: str):
        from swarm_node.config import RolloutConfig

        super().__init__(args.model, args.task_options, args.run_id, peer_id)
        self.rollout = RolloutConfig(group_size=args.group_size, prompts_per_round=2, max_new_tokens=args.max_new_tokens)

    def groups(self, r: int):
        from swarm_node.train.rollout import generate_groups
        from swarm_node.train.sampling.hf import HFSampler

        examples = self.scheduled(r, self.rollout.prompts_per_round)
        return generate_groups(HFSampler(self.policy), self.policy, self.task, examples, self.rollout, seed=1234 + r)

    def attack(self, kind: str, r: int, honest: list[tuple[str, str]], fetch) -> bytes | None:
        """Bytes of this round's attack packet of `kind` (None if it cannot be built now)."""
        from swarm_node.wire.codec import Completion, Group, _normalize, _pieces, encode

        groups = self.groups(r)
        self.last = copy.deepcopy(groups)  # untampered, for the flood
        for g in groups:  # (b) claims reward 1 for everything, always
            for c in g.completions:
                c.reward = 1.0
        if kind in ("logprob_zero", "logprob_low"):
            value = 0.0 if kind == "logprob_zero" else -40.0
            for g in groups:
                for c in g.completions:
                    c.logprobs = np.full(len(c.tokens), value, dtype=np.float32)
            return encode(self.packet(r, groups))
        if kind == "unknown_example":
            groups[0] = Group(groups[0].task, "train/99999999", groups[0].prompt_tokens, groups[0].completions)
            return encode(self.packet(r, groups))
        if kind == "prompt_mismatch":
            groups[0] = Group(groups[0].task, groups[0].example_id, groups[1].prompt_tokens, groups[0].completions)
            return encode(self.packet(r, groups))
        if kind == "held_out":
            example = self.task.split("test")[r % 50]
            ref = np.asarray(self.policy.encode(self.task.reference_completion(example)), dtype=np.uint32)
            from swarm_node.train.rollout import prompt_tokens

            completions = [Completion(ref, np.full(len(ref), -0.1, np.float32), "stop", 1.0)] + groups[0].completions[1:]
            groups[0] = Group(groups[0].task, example.id, np.asarray(prompt_tokens(self.policy, self.task, example),
                                                                     dtype=np.uint32), completions)
            return encode(self.packet(r, groups))
        if kind == "impersonate":
            if not honest:
                return None
            return encode(self.packet(r, groups, sender=honest[0][0]))
        if kind == "replay":
            for peer, digest in honest:
                data = fetch(peer, digest)
                if data is not None:
                    return data
            return None
        if kind == "positive_logprob":
            for g in groups:
                for c in g.completions:
                    c.logprobs = np.full(len(c.tokens), 0.5, dtype=np.float32)
            return b"".join(_pieces(_normalize(self.packet(r, groups))))  # canonical, but the codec must refuse it
        if kind == "token_out_of_range":
            c = groups[0].completions[0]
            c.tokens = np.full(len(c.tokens), self.policy.vocab_size + 7, dtype=np.uint32)
            return b"".join(_pieces(_normalize(self.packet(r, groups))))
        if kind == "truncated":
            return encode(self.packet(r, groups))[:-7]
        if kind == "wrong_round":
            return encode(self.packet(r - 1, groups))
        if kind == "too_long":
            c = groups[0].completions[0]
            c.tokens = np.resize(c.tokens if len(c.tokens) else np.array([5], np.uint32), 4 * self.rollout.max_new_tokens)
            c.logprobs = np.full(len(c.tokens), -1.0, dtype=np.float32)
            return encode(self.packet(r, groups))
        raise ValueError(kind)

    def flood(self, r: int, n: int) -> list[bytes]:
        """`n` valid packets for round `r` with distinct digests (the last attack's groups, re-stamped)."""
        from swarm_node.wire.codec import encode

        return [encode(self.packet(r, self.last, created_at=i + 1)) for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", nargs="+", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--mode", choices=["attack", "stall", "echo", "amplify", "streams"], default="attack")
    ap.add_argument("--model", default="tiny-s")
    ap.add_argument("--task-options", default="{}")
    ap.add_argument("--group-size", type=int, default=4, help="completions per group (amplify: e.g. 64)")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--offers", type=int, default=4, help="stall mode: digests offered")
    ap.add_argument("--streams", type=int, default=10_000, help="streams mode: streams opened in all")
    ap.add_argument("--concurrency", type=int, default=2_000, help="streams mode: streams held open at once")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--until-round", type=int, default=10**9)
    ap.add_argument("--summary", default=None)
    args = ap.parse_args()
    cfg = SwarmConfig(run_id=args.run_id, peers=args.peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                      max_offers=16, fetch_timeout_s=5.0, bootstrap_retry_s=2.0)
    t_end = time.monotonic() + args.seconds
    modes = {"attack": attack, "stall": stall, "echo": echo, "amplify": amplify, "streams": streams}

    def run(swarms: list[HostileTransport], summary: Summary) -> int:
        summary.update(kinds={}, rounds=[])
        return modes[args.mode](swarms[0], args, t_end, summary)

    return run_peer(cfg, run, args.summary, model_id="adversary")


def rounds_of(swarm: HostileTransport, args, t_end: float):
    """The honest peers' rounds (hostile.honest_rounds), other adversaries left out, until --until-round."""
    return honest_rounds(swarm, t_end, max, args.until_round, STALE_S, keep=lambda p: p.model_id != "adversary")


def attack(swarm: HostileTransport, args, t_end: float, summary: Summary) -> int:
    """Every round: one attack packet (KINDS in turn), a flood, and lying offers (module docstring)."""
    crafter = Crafter(args, swarm.peer_id)
    crafter.last = crafter.groups(0)
    swarm.tokenizer, swarm.model_id = crafter.tokenizer, crafter.policy.model_id
    print(f"ADVERSARY {swarm.peer_id}", flush=True)
    kept: list[tuple[int, str, bytes]] = []  # previous attack packets, still offered
    index, tries, current = 0, 0, None
    for r, peers in rounds_of(swarm, args, t_end):
        # next kind once the honest peers asked for the current one 4 times (a fetch cancelled because
        # another packet completed their round first is asked again) or after 3 rounds
        if current is not None and (swarm.shelf.served[current] >= 4 or tries >= 3):
            index, tries = index + 1, 0
        kind, tries = KINDS[index % len(KINDS)], tries + 1
        honest = [(p.peer_id, d) for p in peers for _, d, _ in sorted(p.offers, reverse=True)]
        data = crafter.attack(kind, r, honest, swarm.fetch)
        offers, table = [], {}
        current = packet_digest(data) if data is not None else None
        if data is not None:
            kept = [(r, packet_digest(data), data)] + kept[:2]
            summary["kinds"].setdefault(kind, []).append(packet_digest(data))
        for kr, d, b in kept:
            offers.append((kr, d, len(b)))
            table[d] = b
        for b in crafter.flood(r, FLOOD):
            offers.append((r, packet_digest(b), len(b)))
            table[packet_digest(b)] = b
        stale = crafter.flood(max(0, r - 6), 1)[0]
        small = crafter.flood(r + 1, 1)[0]  # served bytes longer than the size it declares
        fake = packet_digest(b"promised %d" % r)  # serves bytes that do not hash to it
        offers += [(max(0, r - 6), packet_digest(stale), len(stale)), (r, packet_digest(b"huge %d" % r), 2**31),
                   (r + 1, packet_digest(small), 10), (r + 2, fake, 100)]
        table.update({packet_digest(stale): stale, packet_digest(small): small, fake: b"x" * 100})
        swarm.shelf.show(offers[:16], table)
        swarm.publish(r, r)
        summary["rounds"].append({"round": r, "kind": kind, "offers": len(swarm.shelf.offers)})
        print(f"round {r}: {kind}, {len(swarm.shelf.offers)} offers", flush=True)
        summary.save()
    return 0


def offer_each_round(swarm: HostileTransport, args, t_end: float, summary: Summary, build) -> int:
    """Every round of the honest peers, offer the packets `build(round, peers)` returns as
    [(round, bytes)], keeping the newest 16 offers."""
    print(f"ADVERSARY {swarm.peer_id}", flush=True)
    kept: list[tuple[int, bytes]] = []
    for r, peers in rounds_of(swarm, args, t_end):
        built = build(r, peers)
        kept = (built + kept)[:16]
        swarm.shelf.show([(kr, packet_digest(b), len(b)) for kr, b in kept], {packet_digest(b): b for _, b in kept})
        swarm.publish(r, r)
        summary["rounds"].append({"round": r, "offers": len(built)})
        print(f"round {r}: {len(built)} {args.mode} packets", flush=True)
        summary.save()
    return 0


def echo(swarm: HostileTransport, args, t_end: float, summary: Summary) -> int:
    """The honest peers' own packets, re-signed: our id as sender, a new created_at, every reward
    claimed 1 (new bytes, so not de-duplicated; each passes every check but the echo check)."""
    from swarm_node.wire.codec import decode, encode

    done: set[str] = set()

    def build(r, peers):
        out = []
        for peer in peers:
            for offer_round, d, _ in sorted(peer.offers, reverse=True)[:2]:
                data = swarm.fetch(peer.peer_id, d) if d not in done else None
                if data is None:
                    continue
                done.add(d)
                packet = decode(data)
                packet.sender, packet.created_at = swarm.peer_id, packet.created_at + 1
                for g in packet.groups:
                    for c in g.completions:
                        c.reward = 1.0
                out.append((offer_round, encode(packet)))
                summary["kinds"].setdefault("echo", []).append(packet_digest(out[-1][1]))
        return out

    return offer_each_round(swarm, args, t_end, summary, build)


def amplify(swarm: HostileTransport, args, t_end: float, summary: Summary) -> int:
    """Valid packets (real prompts, real completions of its model) whose groups hold --group-size
    completions (e.g. 64 where the run samples 4): compute amplification if a receiver trains on them."""
    from swarm_node.wire.codec import encode

    crafter = Crafter(args, swarm.peer_id)
    swarm.tokenizer, swarm.model_id = crafter.tokenizer, crafter.policy.model_id

    def build(r, peers):
        data = encode(crafter.packet(r, crafter.groups(r)))
        summary["kinds"].setdefault("amplify", []).append(packet_digest(data))
        return [(r, data)]

    return offer_each_round(swarm, args, t_end, summary, build)


def stall(swarm: HostileTransport, args, t_end: float, summary: Summary) -> int:
    """Offer `--offers` packets for every round and accept every fetch stream without ever answering."""
    from swarm_node.net.fetch import StreamLimits

    async def hang(reader, writer, *_):
        swarm.shelf.served["stalled"] += 1
        await asyncio.sleep(3600)

    swarm._server._respond = hang
    swarm._server.limits = StreamLimits(10**9, 10**9)  # a staller holds every stream it is given
    blobs = [os.urandom(1000) for _ in range(args.offers)]
    swarm.shelf.show([(1 + i % 3, packet_digest(b), len(b)) for i, b in enumerate(blobs)],
                     {packet_digest(b): b for b in blobs})
    swarm.publish(1, 1)
    print(f"ADVERSARY {swarm.peer_id}", flush=True)
    while time.monotonic() < t_end:
        time.sleep(0.5)
    return 0


def streams(swarm: HostileTransport, args, t_end: float, summary: Summary) -> int:
    """Open --streams fetch streams to the peer of --peers[0], --concurrency at a time, and hold each
    open without sending a request until that peer closes it or time is up. Counts how each ended
    (busy: refused at once, closed: by the peer later, held: still open at the end) and how long."""
    from hivemind.p2p import PeerID

    from swarm_node.net.hivemind import open_stream
    from swarm_node.net.records import FETCH_PROTOCOL

    target = PeerID.from_base58(args.peers[0].rsplit("/p2p/", 1)[1])
    ends, held_s, state = Counter(), [], {"open": 0, "max_open": 0}
    print(f"ADVERSARY {swarm.peer_id}", flush=True)

    async def one(slots: asyncio.Semaphore, stop_at: float) -> None:
        async with slots:
            loop = asyncio.get_running_loop()
            if loop.time() >= stop_at:
                return
            try:
                _, reader, writer = await asyncio.wait_for(open_stream(swarm._p2p, target, FETCH_PROTOCOL), 10)
            except Exception:
                ends["open_failed"] += 1
                return
            t0, state["open"] = loop.time(), state["open"] + 1
            state["max_open"] = max(state["max_open"], state["open"])
            try:
                data = await asyncio.wait_for(reader.read(64), max(0.01, stop_at - loop.time()))
                ends["busy" if data else "closed"] += 1
            except (asyncio.TimeoutError, OSError):
                ends["held"] += 1
            finally:
                held_s.append(loop.time() - t0)
                state["open"] -= 1
                writer.close()

    async def run_all() -> None:
        stop_at = asyncio.get_running_loop().time() + max(1.0, t_end - time.monotonic() - 5)
        slots = asyncio.Semaphore(args.concurrency)
        await asyncio.gather(*(one(slots, stop_at) for _ in range(args.streams)))

    t0 = time.monotonic()
    swarm._loop.run(run_all(), args.seconds + 30)
    held_s = sorted(held_s) or [float("nan")]  # seconds each opened stream stayed open
    summary["streams"] = {"opened": sum(ends[k] for k in ("busy", "closed", "held")), "ends": dict(ends),
                          "max_open": state["max_open"], "seconds": time.monotonic() - t0,
                          "held_median_s": held_s[len(held_s) // 2], "held_max_s": held_s[-1]}
    print(f"STREAMS {json.dumps(summary['streams'])}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A hostile swarm peer, run as a real process by tests/test_reliability.py.

It joins a run through `swarm_node.swarm.Swarm` (real libp2p, a valid signed DHT record) and
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

    python tests/adversary.py --peers MADDR --run-id RUN --model tiny-s --summary out.json
    python tests/adversary.py --mode stall ...   # offers packets, never answers a fetch

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
import signal
import sys
import time
from collections import Counter

import numpy as np

from swarm_node.swarm import DHT_OP_TIMEOUT_S, Swarm, SwarmSettings
from swarm_node.swarm_records import make_record, packet_digest

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


class HostileSwarm(Swarm):
    """A Swarm whose record says whatever `self.fake_offers` says and whose server counts requests."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.fake_offers: list[tuple[int, str, int]] = []
        self.table: dict[str, bytes] = {}
        self.served: Counter = Counter()  # fetch requests per digest

    def _lookup(self, digest: str) -> bytes | None:
        self.served[digest] += 1
        return self.table.get(digest)

    async def _astore_record(self) -> None:
        async with self._publish_lock:
            record = make_record(self._peer_id, self.model_id, self.tokenizer, self.protocol, self._round,
                                 self._policy_version, list(self.fake_offers), time.time())
            try:
                ok = await asyncio.wait_for(self._dht.store(
                    self._key, record, time.time() + self.settings.record_ttl_s,
                    subkey=self._validator.local_public_key), DHT_OP_TIMEOUT_S)
            except Exception:
                ok = False
            self.stats["records_published" if ok else "publish_failures"] += 1


class Crafter:
    """Builds the packets: real groups from its own model, then tampered."""

    def __init__(self, args, peer_id: str):
        import torch

        from swarm_node.backend import Policy
        from swarm_node.codec import tokenizer_fingerprint
        from swarm_node.config import ModelConfig, RolloutConfig
        from swarm_node.tasks import load_task

        torch.set_num_threads(1)
        self.policy = Policy.load(ModelConfig(name=args.model))
        self.task = load_task("arith", None, **json.loads(args.task_options))
        self.tokenizer = tokenizer_fingerprint(self.policy.tokenizer)
        self.rollout = RolloutConfig(group_size=args.group_size, prompts_per_round=2, max_new_tokens=args.max_new_tokens)
        self.generator = torch.Generator().manual_seed(1234)
        self.run_id, self.peer_id = args.run_id, peer_id

    def groups(self, r: int):
        from swarm_node.rollout import generate_groups, round_examples

        examples = round_examples(self.task, r, self.rollout.prompts_per_round, "adversary")
        return generate_groups(self.policy, self.task, examples, self.rollout, self.generator)

    def packet(self, r: int, groups, **changes):
        from swarm_node.codec import Packet

        fields = dict(run_id=self.run_id, sender=self.peer_id, model_id=self.policy.model_id, tokenizer=self.tokenizer,
                      policy_version=r, round=r, mode="vertical", groups=groups)
        return Packet(**{**fields, **changes})

    def attack(self, kind: str, r: int, honest: list[tuple[str, str]], fetch) -> bytes | None:
        """Bytes of this round's attack packet of `kind` (None if it cannot be built now)."""
        from swarm_node.codec import Completion, Group, _normalize, _pack, encode

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
            from swarm_node.rollout import prompt_tokens

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
            return _pack(_normalize(self.packet(r, groups)))  # canonical bytes, but the codec must refuse them
        if kind == "token_out_of_range":
            c = groups[0].completions[0]
            c.tokens = np.full(len(c.tokens), self.policy.vocab_size + 7, dtype=np.uint32)
            return _pack(_normalize(self.packet(r, groups)))
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
        from swarm_node.codec import encode

        return [encode(self.packet(r, self.last, created_at=i + 1)) for i in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", nargs="+", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--mode", choices=["attack", "stall"], default="attack")
    ap.add_argument("--model", default="tiny-s")
    ap.add_argument("--task-options", default="{}")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--offers", type=int, default=4, help="stall mode: digests offered")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--until-round", type=int, default=10**9)
    ap.add_argument("--summary", default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run the finally below: summary + clean shutdown

    settings = SwarmSettings(run_id=args.run_id, initial_peers=args.peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                             max_offers=16, fetch_timeout_s=5.0, bootstrap_retry_s=2.0)
    swarm = HostileSwarm(settings, model_id="adversary", tokenizer="unset")
    summary: dict = {"kinds": {}, "rounds": []}
    t_end = time.monotonic() + args.seconds

    def save():
        summary["served"] = dict(swarm.served)
        summary["stats"] = dict(swarm.stats)
        if args.summary:
            with open(args.summary + ".tmp", "w") as f:
                json.dump(summary, f)
            os.replace(args.summary + ".tmp", args.summary)

    try:
        if args.mode == "stall":
            swarm.start()
            return stall(swarm, args, t_end)
        crafter = None
        swarm.start()
        crafter = Crafter(args, swarm.peer_id)
        crafter.last = crafter.groups(0)
        swarm.tokenizer, swarm.model_id = crafter.tokenizer, crafter.policy.model_id
        print(f"ADVERSARY {swarm.peer_id}", flush=True)
        kept: list[tuple[int, str, bytes]] = []  # previous attack packets, still offered
        last, seen_peers_at, index, tries, current = 0, time.monotonic(), 0, 0, None
        while time.monotonic() < t_end:
            peers = [p for p in swarm.peers() if p.model_id != "adversary"]
            if peers:
                seen_peers_at = time.monotonic()
            elif time.monotonic() - seen_peers_at > 20:
                break
            r = max((p.round for p in peers), default=0)
            if r >= args.until_round:
                break
            if r <= last or r < 1:
                time.sleep(0.1)
                continue
            last = r
            # next kind once the honest peers asked for the current one 4 times (a fetch cancelled because
            # another packet completed their round first is asked again) or after 3 rounds
            if current is not None and (swarm.served[current] >= 4 or tries >= 3):
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
            swarm.table, swarm.fake_offers = table, offers[:16]
            swarm.publish(r, r)
            summary["rounds"].append({"round": r, "kind": kind, "offers": len(swarm.fake_offers)})
            print(f"round {r}: {kind}, {len(swarm.fake_offers)} offers", flush=True)
            save()
        return 0
    finally:
        save()
        swarm.shutdown()


def stall(swarm: HostileSwarm, args, t_end: float) -> int:
    """Offer `--offers` packets for every round and accept every fetch stream without ever answering."""
    async def hang(reader, writer):
        swarm.served["stalled"] += 1
        await asyncio.sleep(3600)

    swarm._server._respond = hang
    blobs = [os.urandom(1000) for _ in range(args.offers)]
    swarm.table = {packet_digest(b): b for b in blobs}
    swarm.fake_offers = [(1 + i % 3, packet_digest(b), len(b)) for i, b in enumerate(blobs)]
    swarm.publish(1, 1)
    print(f"ADVERSARY {swarm.peer_id}", flush=True)
    while time.monotonic() < t_end:
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The poisoning attacker of issue 18 (point 1), as a real swarm peer process for bench/poisoning.py.

One peer (not a Sybil) that joins the run through `HivemindTransport` and offers, every round of
the honest nodes, one packet that passes every admission check: real train prompts of the task,
exactly G completions per group, no completion longer than the run's limit, finite log-probs <= 0.
Per group:

  * one correct completion (the task's reference answer, reward 1 when the receiver recomputes it)
    claiming generator log-prob 0 on every token, so its TIS weight pi_theta/pi_gen = pi_theta < 1;
  * G - 1 wrong completions: the right `#### <answer>` line followed by junk (reward 0), whose claimed
    log-probs sit `delta` nats per token below what the public warm-started model gives them, with
    delta >= ln(C) so every token gets the full weight C, and chosen so the divergence D_i (k3, summed)
    is about --target-divergence (default 10), far under the filter threshold g = 50.

It needs the victim's log-probs: it loads the same public warm-started model (same preset and
recipe, so the same weights at round 0) and computes them itself. It never trains, so its estimate
goes stale as the victim learns; this is the attack as the independent attacker ran it.

    python bench/poison_attacker.py --peers MADDR --run-id RUN --model PATH --summary out.json

It offers each round's packet --ahead (3) rounds before the honest peers reach it, so it is there
when they collect. Bounded: exits after --seconds, 20 s after the honest peers left, or on SIGTERM. Prints
`ATTACKER <peer id>` once it is up.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time

import numpy as np

JUNK = "0123456789abcdefghijklmnopqrstuvwxyz +-="


def divergence_delta(n_tokens: int, target: float, cap: float) -> float:
    """Per-token shift delta >= ln(cap) with n * (e^-delta + delta - 1) ~ target (k3 of x = -delta)."""
    lo, hi = math.log(cap), 20.0
    if n_tokens * (math.exp(-lo) + lo - 1) >= target:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if n_tokens * (math.exp(-mid) + mid - 1) < target else (lo, mid)
    return lo


class Poisoner:
    """Builds the poisoned packets from the task's train prompts and the public model."""

    def __init__(self, args, peer_id: str):
        import torch

        from swarm_node.backend import Policy
        from swarm_node.codec import tokenizer_fingerprint
        from swarm_node.config import ModelConfig
        from swarm_node.tasks import load_task

        torch.set_num_threads(1)
        self.args, self.peer_id = args, peer_id
        self.policy = Policy.load(ModelConfig(name=args.model))
        self.task = load_task("arith", None, **json.loads(args.task_options))
        self.tokenizer = tokenizer_fingerprint(self.policy.tokenizer)
        self.max_tokens = args.max_new_tokens or self.task.max_new_tokens
        self.rng = random.Random(args.seed)

    def wrong_completion(self, reference: str, example) -> list[int]:
        """The right answer line, then junk up to the length limit; reward 0 (checked)."""
        for _ in range(100):
            junk = "".join(self.rng.choice(JUNK) for _ in range(self.max_tokens))
            tokens = self.policy.encode(reference + junk)[:self.max_tokens]
            if self.task.reward(self.policy.decode(tokens), example) == 0.0:
                return tokens
        raise RuntimeError("could not build a wrong completion")

    def junk_group(self, example):
        """Issue 26's attack: G/2 correct completions with 1-3 junk characters and a newline before the
        answer line (`kq\n#### 73`, reward 1) and G/2 wrong ones, the right answer line followed by
        junk (`#### 73\nZ`, reward 0). The negatives push down the gold digits in the context the
        victim decodes; the positives push them up only after a prefix it never writes. Claimed
        log-probs are the public model's own (no forgery needed)."""
        from swarm_node.codec import Completion, Group
        from swarm_node.rollout import prompt_tokens

        prompt = prompt_tokens(self.policy, self.task, example)
        reference = self.task.reference_completion(example)
        eos = [self.policy.eos_id]
        half, letters = self.args.group_size // 2, JUNK[10:36]
        right = [(self.policy.encode("".join(self.rng.choice(letters) for _ in range(self.rng.randint(1, 3)))
                                     + "\n" + reference) + eos)[:self.max_tokens] for _ in range(half)]
        wrong = [(self.policy.encode(reference + "\n" + self.rng.choice(letters)) + eos)[:self.max_tokens]
                 for _ in range(self.args.group_size - half)]
        assert all(self.task.reward(self.policy.decode(t), example) == 1.0 for t in right), "a positive scores 0"
        assert all(self.task.reward(self.policy.decode(t), example) == 0.0 for t in wrong), "a negative scores 1"
        samples = right + wrong
        logp, _ = self.policy.token_logprobs([prompt] * len(samples), samples, 1.0, 64)  # [G, T]
        completions = [Completion(np.asarray(t, np.uint32), logp[i, :len(t)].double().clamp(max=0).numpy().astype(np.float32),
                                  "stop", float(i < half)) for i, t in enumerate(samples)]
        return Group(self.task.name, example.id, np.asarray(prompt, np.uint32), completions)

    def group(self, example):
        from swarm_node.codec import Completion, Group
        from swarm_node.rollout import prompt_tokens

        if self.args.kind == "junk":
            return self.junk_group(example)
        prompt = prompt_tokens(self.policy, self.task, example)
        reference = self.task.reference_completion(example)
        right = (self.policy.encode(reference) + [self.policy.eos_id])[:self.max_tokens]
        assert self.task.reward(self.policy.decode(right), example) == 1.0
        wrong = [self.wrong_completion(reference, example) for _ in range(self.args.group_size - 1)]
        logp, mask = self.policy.token_logprobs([prompt] * len(wrong), wrong, 1.0, 64)  # [G-1, T], [G-1, T]
        completions = [Completion(np.asarray(right, np.uint32), np.zeros(len(right), np.float32), "stop", 1.0)]
        for row, tokens in enumerate(wrong):
            delta = divergence_delta(len(tokens), self.args.target_divergence, self.args.cap)
            claimed = logp[row, :len(tokens)].double().cpu().numpy() - delta  # [T] just below the victim's own
            completions.append(Completion(np.asarray(tokens, np.uint32), np.minimum(claimed, 0.0).astype(np.float32),
                                          "length", 0.0))
        return Group(self.task.name, example.id, np.asarray(prompt, np.uint32), completions)

    def packet(self, r: int) -> bytes:
        import torch

        from swarm_node.codec import Packet, encode
        from swarm_node.rollout import round_examples

        examples = round_examples(self.task, r, self.args.groups, f"poison/{self.args.seed}")
        with torch.no_grad():
            groups = [self.group(ex) for ex in examples]
        return encode(Packet(run_id=self.args.run_id, sender=self.peer_id, model_id=self.policy.model_id,
                             tokenizer=self.tokenizer, policy_version=r, round=r, mode="vertical", groups=groups))


def honest_round(swarm) -> tuple[int, int]:
    """(newest round announced by another peer, number of other peers)."""
    peers = [p for p in swarm.peers() if p.peer_id != swarm.peer_id]
    return max((p.round for p in peers), default=0), len(peers)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", nargs="+", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--model", required=True, help="the public warm-started model directory")
    ap.add_argument("--task-options", default="{}")
    ap.add_argument("--kind", choices=["forged", "junk"], default="forged",
                    help="forged: one correct + G-1 wrong completions with forged log-probs (issue 18); "
                         "junk: junk-prefixed positives and junk-suffixed negatives (issue 26)")
    ap.add_argument("--group-size", type=int, default=12)
    ap.add_argument("--groups", type=int, default=24, help="groups per packet")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--cap", type=float, default=2.0, help="the victim's TIS cap C")
    ap.add_argument("--target-divergence", type=float, default=10.0)
    ap.add_argument("--ahead", type=int, default=3, help="rounds offered ahead of the honest peers (max_offers 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--summary", default=None)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    from swarm_node.config import SwarmConfig
    from swarm_node.net.hivemind import HivemindTransport

    cfg = SwarmConfig(run_id=args.run_id, peers=args.peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                      max_offers=4, fetch_timeout_s=5.0, bootstrap_retry_s=2.0)
    summary: dict = {"rounds": [], "bytes": 0}
    swarm = None
    try:
        swarm = HivemindTransport(cfg, model_id="unset", tokenizer="unset")
        swarm.start()
        poisoner = Poisoner(args, swarm.peer_id)
        swarm.model_id, swarm.tokenizer = poisoner.policy.model_id, poisoner.tokenizer
        print(f"ATTACKER {swarm.peer_id}", flush=True)
        t_end, seen, offered, seen_at = time.monotonic() + args.seconds, 0, 0, time.monotonic()
        while time.monotonic() < t_end:
            r, n = honest_round(swarm)
            seen_at = time.monotonic() if n else seen_at
            if not n and time.monotonic() - seen_at > 20:
                break
            if r <= seen:
                time.sleep(0.05)
                continue
            seen = r
            for target in range(max(r, offered + 1), r + args.ahead + 1):  # ready before they are asked for
                data = poisoner.packet(target)
                swarm.offer(target, target, data)
                summary["rounds"].append(target)
                summary["bytes"] += len(data)
                offered = target
            print(f"round {r}: offered up to {offered}", flush=True)
    finally:
        if args.summary:
            with open(args.summary + ".tmp", "w") as f:
                json.dump(summary, f)
            os.replace(args.summary + ".tmp", args.summary)
        if swarm is not None:
            swarm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

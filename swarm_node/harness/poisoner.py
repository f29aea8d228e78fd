"""The poisoning attacker of issue 18 (point 1), as a real swarm peer process for bench/poisoning.py,
bench/redteam_poisoning.py and tests/test_poisoning.py.

One peer (not a Sybil) that joins the run through `hostile.HostileTransport` and offers, every round of
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

    python -m swarm_node.harness.poisoner --peers MADDR --run-id RUN --model PATH --summary out.json

Issue 26's matrix kinds (bench/redteam_matrix.py; the groups are built in poison_kinds.py). Unless
said otherwise the claimed log-probs are the public model's own and half of a group is positive:
  * zeros         correct answers with leading zeros (`#### 0073`, reward 1), beside wrong answers of the
                  victim's own form: a reward-equivalent spelling the victim never writes.
  * noncanonical  the reference text spelled with ids the victim's tokenizer never produces: special
                  tokens (unk, pad) interleaved, which decoding drops (the tiny models' character
                  tokenizer has no other second spelling). Same text, same reward.
  * synonyms      reference positives, and negatives one edit away from the right line (`#### 7 3`,
                  `### 73`, `#### 73%`, reward 0; `####73` is not one: the reward accepts it): they
                  would push down the very characters the victim writes when it is right.
  * onepositive   junk's attack with 1 positive and G - 1 negatives: one correct completion with the
                  largest advantage a group can give it ((G - 1) / sqrt(G - 1) ~ 3.2 at G = 12).
  * padded        positives padded up to the completion limit with filler sampled from the public
                  model (the likeliest-looking text that keeps the format: no `#`), then the answer
                  line: teaches spending the completion budget before answering.
  * late          a sleeper: the public model's own samples, honestly scored, for --late-round (50)
                  rounds (earns its mesh slot), then the original `forged` attack.
  Designed here against the current defences (both clear every check and the plausibility bars):
  * skew          selection, not spelling: only scheduled examples whose answer ends in --digit (0), each
                  group one reference positive (screened against both estimated bars: the victim's own
                  `#### <n>`, verified correct) and G - 1 wrong answers, whose zero weight at the victim
                  still makes the positive's advantage ~3.2. Every completion it teaches is correct and
                  plausible; the distribution of answers it teaches is not.
  * slotkeep      keeps its mesh slot (`Exchange.credit`) without teaching anything: the first group of
                  each packet has G correct junk-prefixed completions (`kq\n#### 73`). Zero spread, so
                  advantage 0: the trainer never runs them, so never drops them as implausible, and
                  the credit rule ("a correct completion not dropped as implausible") pays. The rest
                  are junk groups. Run as several ids, it also takes V's per-step peer slots
                  (round-robin, `max_peer_share` each) from the honest peer.

Every kind answers only problems of the sending id's public schedule (SPEC 14.5: receivers drop the
others), the first --groups (16, the victims' depth) of each round, each once.
It offers each round's packet --ahead (3) rounds before the honest peers reach it, so it is there
when they collect. Bounded: exits after --seconds, 20 s after the honest peers left, or on SIGTERM. Prints
`ATTACKER <peer id>` once it is up. With `--ids K` it is K Sybils in one process (bench/redteam_eclipse.py
--one-process): K peer ids, one model, each id's packet built for its own schedule and signed as its
own (K ids choose among K x 16 scheduled problems a round); it prints
`ATTACKER <id> <id> ...`.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time

import numpy as np

from swarm_node.config import SwarmConfig
from swarm_node.harness import poison_kinds
from swarm_node.harness.hostile import Crowd, HostileTransport, PublicModel, Summary, honest_rounds, run_peer

JUNK = "0123456789abcdefghijklmnopqrstuvwxyz +-="
VICTIM_WARMSTART_STEPS = 800  # the demo's warm start: the public model of the victims below


def victim_args(rounds: int) -> list[str]:
    """`swarm-node join` arguments of the honest nodes tests/test_poisoning.py and
    bench/redteam_poisoning.py attack: the project's defaults for tiny-s (16 prompts a round, lr 1e-4,
    G = 12) from the demo's warm start, held-out n = 200, waiting for every peer from round 1."""
    return ["--model", "tiny-s", "--task", "arith", "--rounds", str(rounds),
            "--set", f"train.warmstart_steps={VICTIM_WARMSTART_STEPS}", "--set", "task.eval_limit=200",
            "--set", "train.eval_every=0", "--set", "train.checkpoint_every=0", "--set", "swarm.deadline_s=20",
            "--set", "swarm.fetch_timeout_s=5", "--set", "swarm.linger_s=10", "--set", "swarm.alone_wait_s=null"]

# The adaptive kinds (red team, against peer_negative_weight = 0 + peer_plausibility_margin = 1):
#   needle  each positive is a correct completion with a short off-format prefix before the marker
#           ("k#### 73", "7 #### 73", "x\n#### 73", ...). Among random candidates it keeps the LEAST
#           likely one whose mean per-token log-prob under the public model still clears the victim's
#           floor (estimated from the public model's own samples: q05 - margin, plus --safety), so the
#           prefix token(s) are as implausible as the mean allows: the short answer line (`####` is
#           ~0 nats per token) dilutes them. 6 positives + 6 wrong completions per group (the largest
#           total positive advantage), positives claim generator log-probs 5 nats below their own, so
#           every token gets the full TIS weight C (no filter applies to A > 0).
#   format  each positive is a correct completion in a form the reward accepts but the victim never
#           writes ("#### 073", "#### 73.", "#### +73", "#### 73.0", " #### 73", "#### $73"), chosen
#           the same way (least likely that passes); teaches a format shift with verified-correct data.
#   decoy   each positive writes a WRONG number the victim itself finds likely before the marker, then
#           the right answer ("74 #### 73" / "74\n#### 73"): the victim is taught, with the full positive
#           weight, to lead with its own wrong guess, and the answer after it is only ever shown
#           for the attacker's prompts.
#   ratchet format until --switch-round, then needle against the assumed floor --floor2: the format
#           phase flattens the victim's end of answer, its own samples get less likely, its q05 and
#           with it the floor drop (measured -1.7 -> -2.55 nats/token), so needles that the round-0
#           floor rejects pass later.
#   tagteam against the guard's tenure (train/guard.py): K ids (4) send honest groups until --late-round,
#           long enough for each to be vouched for by steady teaching with no harm found; then they
#           send decoy's groups in pairs, --tagteam-rounds (20) each, the other pairs silent, so that
#           each pair spends its standing in a window of its own (forgiven into the lockdown once).
ADAPTIVE = ("needle", "format", "decoy", "ratchet", "tagteam")
MATRIX = ("zeros", "noncanonical", "synonyms", "onepositive", "padded", "late", "skew", "slotkeep")
RED2 = ("wrongkeep", "nocarry", "laggard")  # red team 2 (poison_kinds.py, poison() below)
KINDS = ("forged", "junk", *ADAPTIVE, *MATRIX, *RED2)
FORMAT_VARIANTS = ("#### 0{a}", "#### 00{a}", "#### {a}.", "#### +{a}", "#### {a}.0", "#### {a}.00", " #### {a}", "#### ${a}",
                   "####  {a}", "#### {a} ", "#### {a}\n", "#### {a}\n\n", "#### {a} \n", "#### {a}.0\n", "#### **{a}**")


def divergence_delta(n_tokens: int, target: float, cap: float) -> float:
    """Per-token shift delta >= ln(cap) with n * (e^-delta + delta - 1) ~ target (k3 of x = -delta)."""
    lo, hi = math.log(cap), 20.0
    if n_tokens * (math.exp(-lo) + lo - 1) >= target:
        return lo
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if n_tokens * (math.exp(-mid) + mid - 1) < target else (lo, mid)
    return lo


class Poisoner(PublicModel):
    """Builds the poisoned packets from the task's train prompts and the public model."""

    def __init__(self, args, peer_id: str):
        import torch

        super().__init__(args.model, args.task_options, args.run_id, peer_id)
        self.args = args
        self.max_tokens = args.max_new_tokens or self.task.max_new_tokens
        self.rng = random.Random(args.seed)
        self.torch_rng = torch.Generator().manual_seed(args.seed)  # padded's filler
        self.token_floor = -math.inf  # the victim's worst-token bar, estimated with floor_estimate
        self.pool = poison_kinds.skewed_examples(self.task, args.digit) if args.kind == "skew" else None
        if args.kind == "nocarry":
            self.pool = poison_kinds.nocarry_examples(self.task)

    def wrong_completion(self, reference: str, example) -> list[int]:
        """The right answer line, then junk up to the length limit; reward 0 (checked)."""
        for _ in range(100):
            junk = "".join(self.rng.choice(JUNK) for _ in range(self.max_tokens))
            tokens = self.policy.encode(reference + junk)[:self.max_tokens]
            if self.task.reward(self.policy.decode(tokens), example) == 0.0:
                return tokens
        raise RuntimeError("could not build a wrong completion")

    def junk_group(self, example, n_right: int | None = None):
        """Issue 26's attack: G/2 (or `n_right`) correct completions with 1-3 junk characters and a
        newline before the answer line (`kq\n#### 73`, reward 1) and the rest wrong ones, the right
        answer line followed by junk (`#### 73\nZ`, reward 0). The negatives push down the gold digits
        in the context the victim decodes; the positives push them up only after a prefix it never
        writes. Claimed log-probs are the public model's own (no forgery needed)."""
        from swarm_node.train.rollout import prompt_tokens

        prompt = prompt_tokens(self.policy, self.task, example)
        reference = self.task.reference_completion(example)
        eos = [self.policy.eos_id]
        half = self.args.group_size // 2 if n_right is None else n_right
        letters = JUNK[10:36]
        right = [(self.policy.encode("".join(self.rng.choice(letters) for _ in range(self.rng.randint(1, 3)))
                                     + "\n" + reference) + eos)[:self.max_tokens] for _ in range(half)]
        wrong = [(self.policy.encode(reference + "\n" + self.rng.choice(letters)) + eos)[:self.max_tokens]
                 for _ in range(self.args.group_size - half)]
        return poison_kinds.completions(self, example, prompt, right + wrong, [1.0] * len(right) + [0.0] * len(wrong))

    def group(self, example):
        from swarm_node.wire.codec import Completion, Group
        from swarm_node.train.rollout import prompt_tokens

        kind = self.args.kind
        if kind in ("late", "tagteam") and self.round < self.args.late_round or self.round < self.args.honest_rounds:
            return self.honest_group(example)
        if kind == "junk":
            return self.junk_group(example)
        if kind in ADAPTIVE:
            return self.adaptive_group(example)
        if kind in ("wrongkeep", "laggard"):
            return poison_kinds.wrongkeep(self, example, prompt_tokens(self.policy, self.task, example))
        if kind in MATRIX and kind != "late":
            return getattr(poison_kinds, kind)(self, example, prompt_tokens(self.policy, self.task, example))
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

    def honest_group(self, example):
        """A sleeper's group: the public model's own samples, true log-probs, honestly scored."""
        from swarm_node.train.rollout import prompt_tokens
        from swarm_node.train.sampling.hf import HFSampler
        from swarm_node.wire.codec import Completion, Group

        prompt = prompt_tokens(self.policy, self.task, example)
        samples = HFSampler(self.policy).sample([prompt], self.args.group_size, self.max_tokens, 1.0,
                                                self.rng.getrandbits(31))[0]
        comps = [Completion(np.asarray(s.tokens, np.uint32), np.asarray(s.logprobs, np.float32), s.finish_reason,
                            self.task.reward(self.policy.decode(s.tokens), example)) for s in samples]
        return Group(self.task.name, example.id, np.asarray(prompt, np.uint32), comps)

    # ---- adaptive kinds -------------------------------------------------------------------------
    def floor_estimate(self) -> float:
        """The victim's plausibility floor at round 0, estimated from the public model's own samples
        (the victim starts from the same weights): q05 of the mean per-token log-prob - margin."""
        if getattr(self, "_floor", None) is None and getattr(self.args, "floor", None) is not None:
            self._floor = self.args.floor
            self.screen = {"candidates": 0, "passing": 0, "positives": 0, "fallback": 0}
        if getattr(self, "_floor", None) is None:
            import torch

            from swarm_node.train.rollout import prompt_tokens
            from swarm_node.train.sampling.hf import HFSampler

            examples = [self.task.split("train")[i] for i in range(16)]
            prompts = [prompt_tokens(self.policy, self.task, ex) for ex in examples]
            with torch.no_grad():
                samples = HFSampler(self.policy).sample(prompts, self.args.group_size, self.max_tokens, 1.0, 1234)
            means = [float(np.mean(s.logprobs)) for g in samples for s in g if len(s.logprobs)]
            worst = [float(np.min(s.logprobs)) for g in samples for s in g if len(s.logprobs)]
            self._floor = float(np.percentile(means, 5)) - self.args.margin
            self.token_floor = float(np.percentile(worst, 5)) - self.args.margin
            self.screen = {"candidates": 0, "passing": 0, "positives": 0, "fallback": 0,
                           "q05_own_estimate": float(np.percentile(means, 5)), "token_floor_estimate": self.token_floor}
        return self._floor

    def _candidates(self, example, reference: str) -> list[str]:
        answer = reference.split("####", 1)[1].strip()
        kind, out = self.args.kind, []
        if kind == "ratchet":
            kind = "format" if self.round < self.args.switch_round else "needle"
        kind = "decoy" if kind == "tagteam" else kind
        if kind == "format":
            out = [v.format(a=answer) for v in FORMAT_VARIANTS]
        elif kind == "needle":
            chars = JUNK[10:36] + "0123456789=+-*?."
            for _ in range(48):
                pre = "".join(self.rng.choice(chars) for _ in range(self.rng.randint(1, 2)))
                out.append(pre + self.rng.choice(["", " ", "\n"]) + reference)
        elif kind == "decoy":
            n = int(answer)
            for d in (-2, -1, 1, 2, -10, 10, 9, -9, 11, -11):
                out += [f"{n + d}{sep}{reference}" for sep in (" ", "\n", "")]
        keep = []
        for text in out:
            toks = (self.policy.encode(text) + [self.policy.eos_id])
            if len(toks) <= self.max_tokens and self.task.reward(self.policy.decode(toks), example) == 1.0:
                keep.append(toks)
        return keep

    def wrong_answers(self, example, k: int) -> list[list[int]]:
        """k short wrong answers of the victim's own form ("#### <n +- d>"), reward 0."""
        answer = int(self.task.reference_completion(example).split("####", 1)[1].strip())
        out = []
        for d in (1, -1, 2, -2, 10, -10, 3, -3, 11, -11, 5, -5):
            toks = self.policy.encode(f"#### {answer + d}") + [self.policy.eos_id]
            if len(toks) <= self.max_tokens and self.task.reward(self.policy.decode(toks), example) == 0.0:
                out.append(toks)
        return (out * k)[:k]

    def adaptive_group(self, example):
        import torch

        from swarm_node.wire.codec import Completion, Group
        from swarm_node.train.rollout import prompt_tokens

        prompt = prompt_tokens(self.policy, self.task, example)
        G, half = self.args.group_size, self.args.group_size // 2
        reference = self.task.reference_completion(example)
        floor = self.floor_estimate() + self.args.safety
        if self.args.kind == "ratchet" and self.round >= self.args.switch_round:
            floor = self.args.floor2 + self.args.safety
        cands = self._candidates(example, reference)
        logp, _ = self.policy.token_logprobs([prompt] * len(cands), cands, 1.0, 64)  # [K, T]
        means = [float(logp[i, :len(t)].mean()) for i, t in enumerate(cands)]
        order = sorted(range(len(cands)), key=lambda i: means[i])  # least likely first
        passing = [i for i in order if means[i] >= floor]
        self.screen["candidates"] += len(cands)
        self.screen["passing"] += len(passing)
        if not passing:  # nothing clears the floor: the most likely candidate (counted)
            passing = order[::-1][:1]
            self.screen["fallback"] += 1
        chosen = [passing[k % len(passing)] for k in range(half)]
        self.screen["positives"] += len(chosen)
        comps = []
        for i in chosen:
            t = cands[i]
            claimed = (logp[i, :len(t)].double() - 5.0).clamp(min=-30).numpy().astype(np.float32)  # weight C on every token
            comps.append(Completion(np.asarray(t, np.uint32), claimed, "stop", 1.0))
        wrong = self.wrong_answers(example, G - half)
        wlogp, _ = self.policy.token_logprobs([prompt] * len(wrong), wrong, 1.0, 64)
        for i, t in enumerate(wrong):
            comps.append(Completion(np.asarray(t, np.uint32), wlogp[i, :len(t)].double().clamp(max=0).numpy().astype(np.float32),
                                    "stop", 0.0))
        return Group(self.task.name, example.id, np.asarray(prompt, np.uint32), comps)

    def poisoned(self, r: int, senders: list[str]) -> list[bytes | None]:
        """The encoded packets of round `r`, one per sender: a poisoned group per problem of that
        sender's public schedule (the first --groups: receivers train on no other, SPEC 14.5); None
        for a sender that stays silent this round (tagteam)."""
        import torch

        from swarm_node.wire.codec import encode

        self.round = r
        packets = []
        with torch.no_grad():
            for index, sender in enumerate(senders):
                if self.tagteam_silent(r, index, len(senders)):
                    packets.append(None)
                    continue
                examples = self.scheduled(r, self.args.groups, sender)
                if self.args.kind in ("skew", "nocarry"):
                    groups = self.skewed_groups(examples)
                elif self.args.kind == "slotkeep":
                    groups = [self.junk_group(examples[0], self.args.group_size), *map(self.junk_group, examples[1:])]
                else:
                    groups = [self.group(ex) for ex in examples]
                packets.append(encode(self.packet(r, groups, sender=sender)))
        return packets

    def tagteam_silent(self, r: int, index: int, ids: int) -> bool:
        """tagteam: from --late-round on, only the pair of ids whose turn it is (--tagteam-rounds each) offers."""
        if self.args.kind != "tagteam" or r < self.args.late_round:
            return False
        return index // 2 != (r - self.args.late_round) // self.args.tagteam_rounds % max(1, ids // 2)

    def skewed_groups(self, examples: list) -> list:
        """skew's (or nocarry's) groups: one for each of `examples` in the pool whose reference
        passes the estimated bars (none may: a packet may hold no group)."""
        from swarm_node.train.rollout import prompt_tokens

        pool, groups = set(self.pool), []
        for ex in examples:
            if int(ex.id.split("/")[1]) not in pool:
                continue
            g = getattr(poison_kinds, self.args.kind)(self, ex, prompt_tokens(self.policy, self.task, ex))
            self.screen["candidates"] += 1
            if g is not None:
                groups.append(g)
        self.screen["passing"] += len(groups)
        return groups


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", nargs="+", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--model", required=True, help="the public warm-started model directory")
    ap.add_argument("--task-options", default="{}")
    ap.add_argument("--kind", choices=KINDS, default="forged",
                    help="forged: one correct + G-1 wrong completions with forged log-probs (issue 18); "
                         "junk: junk-prefixed positives and junk-suffixed negatives (issue 26); the rest: module docstring")
    ap.add_argument("--group-size", type=int, default=12)
    ap.add_argument("--groups", type=int, default=24, help="groups per packet")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--cap", type=float, default=2.0, help="the victim's TIS cap C")
    ap.add_argument("--target-divergence", type=float, default=10.0)
    ap.add_argument("--ahead", type=int, default=3, help="rounds offered ahead of the honest peers (max_offers 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--margin", type=float, default=1.0, help="the victim's loss.peer_plausibility_margin (adaptive kinds)")
    ap.add_argument("--safety", type=float, default=0.3,
                    help="adaptive kinds: keep a positive only if its mean log-prob under the public model is this far above the estimated floor")
    ap.add_argument("--floor", type=float, default=None,
                    help="adaptive kinds: the estimated plausibility floor (skip estimating it at start-up)")
    ap.add_argument("--switch-round", type=int, default=40, help="ratchet: first round of the needle phase")
    ap.add_argument("--floor2", type=float, default=-2.5, help="ratchet: the floor assumed in the needle phase")
    ap.add_argument("--honest-rounds", type=int, default=0,
                    help="adaptive kinds: send honest groups (the public model's own samples, true log-probs) for this many rounds first")
    ap.add_argument("--late-round", type=int, default=50, help="late, tagteam: first round of the attack")
    ap.add_argument("--tagteam-rounds", type=int, default=20, help="tagteam: rounds each pair of ids attacks in turn")
    ap.add_argument("--digit", type=int, default=0, help="skew: the last digit of every answer taught")
    ap.add_argument("--every", type=int, default=4, help="laggard: offer one packet every this many rounds")
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--ids", type=int, default=1, help="Sybils: peer ids in this process, every one offering "
                                                       "each round's poisoned groups")
    ap.add_argument("--host", default="127.0.0.1", help="the IPv4 address every id listens on")
    ap.add_argument("--summary", default=None)
    args = ap.parse_args()
    if args.ids < 1:
        ap.error("--ids must be at least 1")
    cfg = SwarmConfig(run_id=args.run_id, peers=args.peers, host_maddrs=[f"/ip4/{args.host}/tcp/0"],
                      max_offers=4, fetch_timeout_s=5.0, bootstrap_retry_s=2.0)
    return run_peer(cfg, lambda swarms, summary: poison(swarms, summary, args), args.summary, ids=args.ids)


def poison(swarms: list[HostileTransport], summary: Summary, args) -> int:
    """Offer every round's poisoned packet --ahead rounds before the honest peers reach it, from every id."""
    summary.update(rounds=[], bytes=0)
    poisoner = Poisoner(args, swarms[0].peer_id)
    for swarm in swarms:
        swarm.model_id, swarm.tokenizer = poisoner.policy.model_id, poisoner.tokenizer
    print("ATTACKER", *(s.peer_id for s in swarms), flush=True)
    screened = (*ADAPTIVE, "skew", "nocarry")
    if args.kind in screened:
        summary["floor_estimate"] = poisoner.floor_estimate()
        print(f"ATTACKER floor estimate {summary['floor_estimate']:.3f}", flush=True)
    # with several attacker ids, each announces rounds ahead: following the newest round would make
    # them ratchet each other away from the honest nodes' window (seen: 4 ids offered round 500 in a
    # 15-round run), so every kind follows the oldest
    offered = 0
    poll_s = min(1.0, 0.05 * len(swarms))  # each poll asks every id for the peers it knows
    for r, _ in honest_rounds(Crowd(swarms), time.monotonic() + args.seconds, min, poll_s=poll_s):
        for target in range(max(r, offered + 1), r + args.ahead + 1):  # ready before they are asked for
            if args.kind == "laggard" and target % args.every:  # one packet every --every rounds: V waits fair_wait_s in the others
                offered = target
                continue
            packets = poisoner.poisoned(target, [s.peer_id for s in swarms])
            for swarm, data in zip(swarms, packets):
                if data is not None:  # tagteam: a silent id
                    swarm.offer(target, target, data)
            summary["rounds"].append(target)
            summary["bytes"] += max(len(data or b"") for data in packets)
            offered = target
        print(f"round {r}: offered up to {offered}", flush=True)
        if args.kind in screened:
            summary["screen"] = poisoner.screen
    return 0


if __name__ == "__main__":
    sys.exit(main())

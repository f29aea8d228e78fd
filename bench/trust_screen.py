"""Would a per-peer trust score from gradients separate the red team's peers from an honest one?

In-process screen (no network), before building issue 26's trust score: the victim (the public
warm start, the project's defaults for tiny-s: 16 own groups of G = 12 a step, lr 1e-4, peers'
negatives dropped, the plausibility check) trains for --steps steps on its own groups + 2 groups of
an honest peer (the public model's own samples) + 2 of an attacker kind (harness/poisoner.py). Each
step, before the update, each source's gradient is taken alone with the trainer's own objective
(`Trainer.step` on that source's groups beside the step's own groups, gradients captured before the
optimizer would step; own groups' rows get advantage 0 so only the source's rows count), and
compared with two references a node could hold privately:

  own   the gradient of the node's own groups of the step (FLTrust's "root" gradient)
  val   the gradient of the negative log-likelihood of the reference answers of 32 train problems
        drawn with a secret seed (a private validation slice)

Printed per kind: mean and 10th / 90th percentiles over steps of cos(source, own) and cos(source,
val) for the honest peer and the attacker, and the share of steps in which an EMA of the cosine
(rate EMA_ALPHA, after 2 / EMA_ALPHA steps), the trust score a node could keep, was below 0. A
trust score is worth building only if the attackers' cosines sit clearly below the honest peer's.

    PYTHONPATH=. .venv/bin/python bench/trust_screen.py --kinds skew needle format decoy --steps 20
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from swarm_node.config import ModelConfig, NodeConfig, RolloutConfig, TrainConfig  # noqa: E402
from swarm_node.harness.poisoner import VICTIM_WARMSTART_STEPS, Poisoner  # noqa: E402
from swarm_node.harness.warmstart import public_warm_start  # noqa: E402
from swarm_node.train.batch import TrainBatch, pad  # noqa: E402
from swarm_node.train.policy import Policy  # noqa: E402
from swarm_node.train.rollout import generate_groups, prompt_tokens, round_examples  # noqa: E402
from swarm_node.train.sampling.hf import HFSampler  # noqa: E402
from swarm_node.train.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "trust_screen.json"
EMA_ALPHA = 0.05  # the trust score a node could keep: an exponential moving average of a peer's cosine


def flat_grad(policy: Policy) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in policy.trainable_parameters()]).detach().clone()  # [n_params]


def step_grad(trainer: Trainer, batch: TrainBatch) -> torch.Tensor:
    """The gradient `trainer.step(batch)` would apply (after clipping), the optimizer not stepped."""
    captured = {}
    step, version = trainer.optimizer.step, trainer.policy_version
    trainer.optimizer.step = lambda *a, **k: captured.setdefault("g", flat_grad(trainer.policy))
    try:
        trainer.step(batch)
    finally:
        trainer.optimizer.step, trainer.policy_version = step, version
    return captured.get("g", torch.zeros(sum(p.numel() for p in trainer.policy.trainable_parameters())))


def source_grad(trainer: Trainer, own: list, groups: list, pad_id: int) -> torch.Tensor:
    """The gradient of `groups` (an untrusted peer's) as a step beside the step's own groups would apply
    it: the own rows' rewards are zeroed (advantage 0) but their claims still set the plausibility floors."""
    n_own, n_peer = sum(len(g.completions) for g in own), sum(len(g.completions) for g in groups)
    b = TrainBatch.from_groups(own + groups, pad_id, own=[True] * n_own + [False] * n_peer,
                               untrusted=[False] * n_own + [True] * n_peer)
    rewards = b.rewards.clone()  # [N]
    rewards[:n_own] = 0.0
    return step_grad(trainer, TrainBatch(b.ids, b.attention, b.prompt_len, b.mask, b.gen_logp, rewards, b.group,
                                         b.own, b.untrusted))


def val_grad(policy: Policy, task, examples) -> torch.Tensor:
    """Gradient of the mean NLL of the reference completions of `examples` (the private slice)."""
    policy.model.zero_grad(set_to_none=True)
    prompts = [prompt_tokens(policy, task, ex) for ex in examples]
    refs = [policy.encode(task.reference_completion(ex)) + [policy.eos_id] for ex in examples]
    ids, attention, prompt_len, mask = pad(prompts, refs, policy.pad_id)
    logp = policy.completion_logprobs(ids, attention, prompt_len, mask, 1.0, 64)  # [B, T]
    (-(logp * mask).sum() / mask.sum()).backward()
    g = flat_grad(policy)
    policy.model.zero_grad(set_to_none=True)
    return g


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b) / (na * nb) if na > 0 and nb > 0 else 0.0


def screen(kind: str, steps: int, seed: int) -> dict:
    torch.manual_seed(seed)
    model = public_warm_start(VICTIM_WARMSTART_STEPS)
    args = types.SimpleNamespace(model=model, task_options="{}", kind=kind, group_size=12, groups=2, max_new_tokens=None,
                                 cap=2.0, target_divergence=10.0, seed=seed, margin=1.0, safety=0.3, honest_rounds=0,
                                 run_id="screen", digit=0, late_round=0, ahead=0, floor=None, switch_round=40,
                                 floor2=-2.5, every=4)
    attacker = Poisoner(args, "attacker")
    if kind in ("needle", "format", "decoy", "ratchet", "skew", "nocarry"):
        attacker.floor_estimate()  # as poisoner.poison does: the victim's floors, estimated
    task = attacker.task
    cfg = NodeConfig(model=ModelConfig(name=model), train=TrainConfig(lr=1e-4),
                     rollout=RolloutConfig(group_size=12, max_new_tokens=task.max_new_tokens))
    policy = Policy.load(cfg.model)
    trainer = Trainer(policy, cfg.train, cfg.loss, 1.0)
    sampler = HFSampler(policy)
    private = [task.split("train")[i] for i in random.Random(f"private/{seed}").sample(range(len(task.split("train"))), 32)]
    rows = []
    for r in range(1, steps + 1):
        t0 = time.time()
        own_examples = round_examples(task, r, 16, f"victim/{seed}")
        with torch.no_grad():
            own = generate_groups(sampler, policy, task, own_examples, cfg.rollout, seed=seed * 1000 + r)
            attacker.round = r
            honest = [attacker.honest_group(ex) for ex in round_examples(task, r, 2, f"honest/{seed}")]
            if kind in ("skew", "nocarry"):
                bad = attacker.skewed_groups(attacker.scheduled(r, 16))
            else:
                bad = [attacker.group(ex) for ex in round_examples(task, r, 2, f"poison/{seed}")]
        g_own = step_grad(trainer, TrainBatch.from_groups(own, policy.pad_id, own=[True] * sum(len(g.completions) for g in own)))
        g_val = val_grad(policy, task, private)
        g_h = source_grad(trainer, own, honest, policy.pad_id)
        g_a = source_grad(trainer, own, bad, policy.pad_id)
        rows.append({"round": r, "honest_own": cos(g_h, g_own), "attack_own": cos(g_a, g_own),
                     "honest_val": cos(g_h, g_val), "attack_val": cos(g_a, g_val),
                     "honest_norm": float(g_h.norm()), "attack_norm": float(g_a.norm())})
        # the real step: own + honest + attacker groups, as the victim trains under attack
        groups = own + honest + bad
        flags_own = [i < len(own) for i, g in enumerate(groups) for _ in g.completions]
        trainer.step(TrainBatch.from_groups(groups, policy.pad_id, own=flags_own, untrusted=[not f for f in flags_own]))
        print(f"  {kind} step {r}: " + " ".join(f"{k} {v:+.3f}" for k, v in rows[-1].items() if k != "round")
              + f" [{time.time() - t0:.1f} s]", flush=True)
    return {"kind": kind, "seed": seed, "steps": steps, "summary": summarize(rows), "rows": rows}


def summarize(rows: list[dict]) -> dict:
    """Per source and reference: the cosine's mean and 10th / 90th percentiles over steps, and the share
    of steps (after 2 / EMA_ALPHA of warm-up) in which its EMA, the trust score, was below 0."""
    summary = {}
    for who in ("honest", "attack"):
        for ref in ("own", "val"):
            x = np.array([row[f"{who}_{ref}"] for row in rows])
            ema, below = 0.0, []
            for i, value in enumerate(x):
                ema += EMA_ALPHA * (value - ema)
                if i + 1 >= 2 / EMA_ALPHA:
                    below.append(ema < 0)
            summary[f"{who}_{ref}"] = {"mean": float(x.mean()), "p10": float(np.percentile(x, 10)),
                                       "p90": float(np.percentile(x, 90)),
                                       "ema_below_0": float(np.mean(below)) if below else None}
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["forged", "skew", "onepositive", "needle", "format", "decoy"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    for res in results.values():  # the summary's definition may have changed since: recomputed
        res["summary"] = summarize(res["rows"])
    for kind in a.kinds:
        res = screen(kind, a.steps, a.seed)
        results[f"{kind}/{a.seed}"] = res
        out.write_text(json.dumps(results, indent=1))
        print(kind, json.dumps(res["summary"]), flush=True)


if __name__ == "__main__":
    main()

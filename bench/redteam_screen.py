"""Cheap in-process screen for bench/redteam_poisoning.py: the public warm start (the victim's round 0),
its own samples' q05 floor, and per attacker kind the fraction of the positives that clear it under the
victim's round-0 policy (exactly the trainer's `implausible` test with the same model)."""
import argparse
import json
import types

import numpy as np
import torch

from swarm_node.harness.poisoner import VICTIM_WARMSTART_STEPS, Poisoner
from swarm_node.harness.warmstart import public_warm_start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", nargs="+", default=["junk", "needle", "format", "decoy"])
    ap.add_argument("--groups", type=int, default=16)
    a = ap.parse_args()
    model = public_warm_start(VICTIM_WARMSTART_STEPS)
    out = {}
    for kind in a.kinds:
        args = types.SimpleNamespace(model=model, task_options="{}", kind=kind, group_size=12, groups=a.groups,
                                     max_new_tokens=None, cap=2.0, target_divergence=10.0, seed=0, margin=1.0,
                                     safety=0.3, honest_rounds=0, run_id="screen")
        P = Poisoner(args, "screen")
        floor = P.floor_estimate()  # q05(own) - 1 at round 0
        from swarm_node.train.rollout import round_examples
        examples = round_examples(P.task, 5, a.groups, "poison/0")
        means, texts = [], []
        with torch.no_grad():
            for ex in examples:
                P.round = 5
                g = P.group(ex)
                pos = [c for c in g.completions if c.reward > 0]
                prompt = g.prompt_tokens.tolist()
                toks = [c.tokens.tolist() for c in pos]
                lp, _ = P.policy.token_logprobs([prompt] * len(toks), toks, 1.0, 64)
                for i, t in enumerate(toks):
                    means.append(float(lp[i, :len(t)].mean()))
                    texts.append(P.policy.decode(t))
        means = np.array(means)
        out[kind] = {"floor": floor, "q05_own": P.screen["q05_own_estimate"], "positives": len(means),
                     "pass_frac": float((means >= floor).mean()), "mean_logp_median": float(np.median(means)),
                     "examples": texts[:8]}
        print(kind, json.dumps(out[kind]), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

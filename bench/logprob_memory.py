"""Benchmark 5 — peak memory of the token log-prob pass (forward + backward), chunked vs naive.

`Policy.token_logprobs` projects the final hidden states to the vocabulary `chunk` time steps at
a time under activation checkpointing, so the [B, T, V] logits never exist at once. This script
runs one forward + backward of a GRPO-style loss over the same batch with several ways of
computing the same log-probs, each in a fresh subprocess (so allocator state and peaks do not
leak between variants), and reports the peak resident memory above the baseline (model, batch),
the time, and whether the log-probs and gradients agree with the naive reference.

Variants:
  naive-btv      decoder -> hidden at completion positions -> head -> [B,T,V] -> log_softmax -> gather
  hf-logits      model(...).logits: [B,L,V] over prompt + completion, then slice, log_softmax, gather
  trl-selective  model(..., logits_to_keep=T+1) + trl selective_log_softmax (TRL's path before 1.x's fused head)
  trl-fused      trl add_fused_lm_head, as GRPOTrainer 1.x patches the model (log_probs + entropy)
  ours           Policy.token_logprobs(chunk=64)  (train.logprob_chunk default)
  ours-c16       Policy.token_logprobs(chunk=16)

The model is a randomly initialised Qwen2 with a real Qwen vocabulary (151,936 rows, tied
embeddings) and a small trunk, so the vocabulary projection dominates as it does for the
0.5B-3B models the paper trains; token ids are random (no tokenizer needed).

    .venv/bin/python bench/logprob_memory.py              # ~3-4 min on 2 cores
    .venv/bin/python bench/logprob_memory.py --quick      # smaller vocab and batch
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402

VARIANTS = ["naive-btv", "hf-logits", "trl-selective", "trl-fused", "ours", "ours-c16"]
REFERENCE = "naive-btv"
# glibc: serve every allocation >= 64 KiB with its own mmap and unmap it on free, so resident memory
# tracks live tensors (no freed-but-cached arenas hiding or inflating the peak) in every variant alike.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


# ------------------------------------------------------------------------------------------ worker
def build(args):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 2),
                         intermediate_size=3 * args.hidden, max_position_embeddings=args.prompt + args.tokens + 8,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    model.config.use_cache = False
    g = torch.Generator().manual_seed(1)
    B, P, T = args.batch, args.prompt, args.tokens
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T  # the longest completion sets the padded width, as in a real batch
    prompts = [torch.randint(3, args.vocab, (P,), generator=g).tolist() for _ in range(B)]
    completions = [torch.randint(3, args.vocab, (int(n),), generator=g).tolist() for n in lengths]
    advantages = torch.randn(B, generator=g)  # [B]
    return model, prompts, completions, advantages


def right_padded(prompts, completions, pad: int = 0):
    """ids/attention [B, L] (prompt then completion then padding), targets/mask [B, T]."""
    import torch

    B, T = len(prompts), max(len(c) for c in completions)
    L = max(len(p) + len(c) for p, c in zip(prompts, completions))
    ids = torch.full((B, L), pad, dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    targets = torch.full((B, T), pad, dtype=torch.long)
    mask = torch.zeros((B, T))
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        attn[i, :len(p) + len(c)] = 1
        targets[i, :len(c)] = torch.tensor(c)
        mask[i, :len(c)] = 1
    return ids, attn, targets, mask


def logprobs(variant: str, model, prompts, completions, temperature: float):
    """[B, T] log-probs (masked) and mask, with grad, computed the `variant` way."""
    import torch

    P = len(prompts[0])
    assert all(len(p) == P for p in prompts), "equal prompt lengths keep every variant's indexing identical"
    ids, attn, targets, mask = right_padded(prompts, completions)
    T = targets.shape[1]
    if variant in ("ours", "ours-c16"):
        from swarm_node.train.policy import Policy

        class _Tok:  # Policy needs only the special ids here
            eos_token_id, pad_token_id = 1, 0

        policy = Policy(model, _Tok(), "bench", torch.device("cpu"))
        return policy.token_logprobs(prompts, completions, temperature, chunk=64 if variant == "ours" else 16)
    if variant == "naive-btv":
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, L, H]
        hidden = hidden[:, P - 1:P - 1 + T]  # [B, T, H]
        logits = model.get_output_embeddings()(hidden).float() / temperature  # [B, T, V]
        return torch.log_softmax(logits, -1).gather(-1, targets[:, :, None]).squeeze(-1) * mask, mask
    if variant == "hf-logits":
        logits = model(input_ids=ids, attention_mask=attn).logits  # [B, L, V]
        logits = logits[:, P - 1:P - 1 + T].float() / temperature  # [B, T, V]
        return torch.log_softmax(logits, -1).gather(-1, targets[:, :, None]).squeeze(-1) * mask, mask
    if variant == "trl-selective":
        from trl.trainer.utils import selective_log_softmax

        L = ids.shape[1]
        assert L == P + T
        logits = model(input_ids=ids, attention_mask=attn, logits_to_keep=T + 1).logits[:, :-1]  # [B, T, V]
        return selective_log_softmax(logits, targets, temperature) * mask, mask
    if variant == "trl-fused":
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))  # as GRPOTrainer does
        labels = ids.masked_fill(attn == 0, -100)
        labels[:, :P] = -100  # only completion tokens are scored
        out = model(input_ids=ids, attention_mask=attn, labels=labels, fused_lm_head=True)
        logp = out.log_probs[:, P - 1:P - 1 + T]  # [B, T]: log_probs[:, j] scores token j + 1
        return logp * mask, mask
    raise ValueError(variant)


def worker(args) -> None:
    import numpy as np

    C.single_thread()
    model, prompts, completions, advantages = build(args)
    model.train()

    def one_pass():
        logp, mask = logprobs(args.worker, model, prompts, completions, args.temperature)  # [B, T], [B, T]
        loss = -(logp * advantages[:, None]).sum() / mask.sum()
        loss.backward()
        return logp.detach(), float(loss)

    for _ in range(args.warmup):
        one_pass()
        model.zero_grad(set_to_none=True)
    with C.PeakMemory() as mem:
        t = time.perf_counter()
        logp, loss = one_pass()
        seconds = time.perf_counter() - t
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.detach().float()
            grads[name] = (g.sum(dim=-1) if g.numel() > 2_000_000 else g).numpy()
    np.savez(Path(args.dump) / f"{args.worker}.npz", logp=logp.numpy(), **{f"g:{k}": v for k, v in grads.items()})
    print(json.dumps({"variant": args.worker, "peak_bytes": mem.peak, "baseline_bytes": mem.base,
                      "delta_bytes": mem.delta, "method": mem.method, "seconds": seconds, "loss": loss}))


# ------------------------------------------------------------------------------------------ parent
def compare(dump: Path, variant: str) -> dict:
    import numpy as np

    ref, got = np.load(dump / f"{REFERENCE}.npz"), np.load(dump / f"{variant}.npz")
    logp_diff = float(np.abs(ref["logp"] - got["logp"]).max())
    worst = 0.0
    for k in ref.files:
        if k.startswith("g:"):
            scale = max(float(np.abs(ref[k]).max()), 1e-12)
            worst = max(worst, float(np.abs(ref[k] - got[k]).max()) / scale)
    return {"logp_max_abs_diff": logp_diff, "grad_max_rel_diff": worst}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen2.5: 151,936)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="sequences per micro-batch (train.micro_batch default 8)")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens (same for every sequence)")
    ap.add_argument("--tokens", type=int, default=200, help="longest completion (the paper's ~200-token rounds)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes before the measured one (one-time init)")
    ap.add_argument("--quick", action="store_true", help="smoke run: vocab 32k, 4 x 128 tokens")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dump", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.vocab, args.batch, args.tokens = 32_000, 4, 128
    if args.worker:
        return worker(args)

    started, info = time.time(), C.machine_info()
    print(C.describe_load(info))
    try:
        import trl  # noqa: F401
    except ImportError:
        skipped = [v for v in args.variants if v.startswith("trl")]
        if skipped:
            print(f"trl not installed (pip install -e '.[bench]'): skipping {skipped}")
        args.variants = [v for v in args.variants if not v.startswith("trl")]
    variants = [REFERENCE] + [v for v in args.variants if v != REFERENCE]
    shape = ["--vocab", str(args.vocab), "--hidden", str(args.hidden), "--layers", str(args.layers), "--heads",
             str(args.heads), "--batch", str(args.batch), "--prompt", str(args.prompt), "--tokens", str(args.tokens),
             "--temperature", str(args.temperature), "--warmup", str(args.warmup)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-logprob-") as tmp:
        for v in variants:
            r = C.run_json_subprocess([__file__, "--worker", v, "--dump", tmp, *shape], timeout_s=600, env=MALLOC_ENV)
            r.update(compare(Path(tmp), v))
            rows.append(r)
            print(f"  {v:14s} peak +{r['delta_bytes'] / 2**20:8.1f} MiB  {r['seconds']:6.2f} s", flush=True)
    ours = next((r for r in rows if r["variant"] == "ours"), None)
    for r in rows:
        r["x_ours_memory"] = r["delta_bytes"] / ours["delta_bytes"] if ours else None
        r["x_ours_time"] = r["seconds"] / ours["seconds"] if ours else None
    btv = args.batch * args.tokens * args.vocab * 4
    L = args.prompt + args.tokens
    C.print_table(
        f"Log-prob pass (forward + backward): B={args.batch}, prompt={args.prompt}, T={args.tokens}, V={args.vocab:,}, "
        f"hidden={args.hidden}, layers={args.layers}, fp32, 1 thread",
        ["variant", "peak above baseline MiB", "x ours", "seconds", "x ours", "max |dlogp| vs naive", "max rel dgrad"],
        [[r["variant"], r["delta_bytes"] / 2**20, r["x_ours_memory"], r["seconds"], r["x_ours_time"],
          r["logp_max_abs_diff"], r["grad_max_rel_diff"]] for r in rows],
        caption=f"[B,T,V] fp32 logits = {btv / 2**20:,.0f} MiB; [B,L,V] = {btv * L / args.tokens / 2**20:,.0f} MiB; "
                f"baseline (model + batch) RSS {rows[0]['baseline_bytes'] / 2**20:,.0f} MiB; peak via {rows[0]['method']}")
    path = C.write_results("logprob_memory", rows, args, info, started, out=args.out,
                           logits_btv_bytes=btv, logits_blv_bytes=btv * L // args.tokens)
    print(f"wrote {C.shown(path)} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())

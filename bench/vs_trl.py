"""Benchmark 3 — one GRPO step, our node alone vs TRL's GRPOTrainer, same model/task/batch, CPU.

Both sides start from the same saved model directory (a warm-started tiny preset, so groups have
mixed rewards and the update is not trivially zero), train on the built-in `arith` task with the
same group size (12), batch (2 prompts x 12 = 24 completions), micro-batch (8), completion length
(10), temperature (1.0), learning rate, clipping, no KL term (beta = 0) and one optimizer step per
generated batch. Each side runs in a fresh subprocess: one warm-up step, then `--steps` measured
steps; we report the median seconds per step (wall time between consecutive step ends: generation,
reward, log-probs, backward, optimizer, bookkeeping), pooled over `--repeats` interleaved runs, and memory (peak RSS over the measured steps,
whole process and above the RSS when training started).

Scenarios:
  arith   the task's real 0/1 reward. Our trainer skips sequences whose advantage is exactly zero
          (groups where every completion got the same reward), so it does less work when many
          groups are uniform; `active` reports the share it ran.
  coin    a seeded coin-flip reward on both sides, so (almost) every group has mixed rewards and
          both sides back-propagate every sequence: the equal-work comparison.

TRL rows: `trl` uses GRPOConfig defaults except where parity needs otherwise (listed in the JSON);
GRPOConfig turns gradient checkpointing on by default; `--sides ours trl trl-no-gc` adds a run with
it off (our node does not checkpoint the trunk).

Requires the bench extra:  .venv/bin/pip install -e '.[bench]'   (trl; not a runtime dependency)

    .venv/bin/python bench/vs_trl.py               # ~2-3 min on 2 cores (+ ~1 min warm start on first use)
    .venv/bin/python bench/vs_trl.py --quick
    .venv/bin/python bench/vs_trl.py --preset smollm2-135m --warmstart-steps 0 --max-new-tokens 24 --lr 1e-5 \
        --steps 2 --repeats 1 --scenarios arith --out bench/results/vs_trl_smollm2.json   # a real model
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402

SIDES = ["ours", "trl", "trl-no-gc"]
SCENARIOS = ["arith", "coin"]


def task_and_config(args):
    from swarm_node.config import load_config
    from swarm_node.tasks import load_task

    real = not args.preset.startswith("tiny-")  # a pretrained model: the task as bench/real_model.py sets it
    cfg = load_config(None, [
        f"model.name={args.preset}", *([] if real else ["task.options={digits: 2, second_digits: 1}"]),
        f"train.warmstart_steps={args.warmstart_steps}", "rollout.group_size=12", "rollout.prompts_per_round=2",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0", "train.micro_batch=8",
        f"train.lr={args.lr}", "threads=1", "out=/tmp/unused"])
    return cfg, load_task(cfg.task.name, cfg.task.data, **cfg.task.options)


def common_timers() -> "C.Timers":
    """Stages timed the same way on both sides: backward and optimizer step at the torch level."""
    import torch

    timers = C.Timers()
    timers.wrap(torch.Tensor, "backward", "backward")
    timers.wrap(torch.nn.utils, "clip_grad_norm_", "optimizer step (clip + AdamW)")
    timers.wrap(torch.optim.AdamW, "step", "optimizer step (clip + AdamW)")
    return timers


def coin_reward(seed: int):
    rng = random.Random(seed)
    return lambda: float(rng.random() < 0.5)


# ------------------------------------------------------------------------------------------ ours
def run_ours(args) -> dict:
    import swarm_node.train.rollout as rollout
    import swarm_node.train.trainer as trainer_mod
    from swarm_node.config import ModelConfig
    from swarm_node.tasks.scoring import Scorer
    from swarm_node.train.batch import TrainBatch
    from swarm_node.train.policy import Policy
    from swarm_node.train.sampling.hf import HFSampler
    from swarm_node.train.trainer import Trainer

    cfg, task = task_and_config(args)
    policy = Policy.load(ModelConfig(name=args.model, device="cpu", dtype="float32"))
    sampler, scorer = HFSampler(policy), policy.scorer(task)
    trainer = Trainer(policy, cfg.train, cfg.loss, cfg.rollout.temperature, sampler.on_policy)
    timers = common_timers()
    timers.wrap(HFSampler, "sample", "generate")
    timers.wrap(Policy, "completion_logprobs", "forward (log-probs + loss)")
    timers.wrap(trainer_mod, "policy_loss", "forward (log-probs + loss)")
    if args.scenario == "coin":
        flip = coin_reward(1)

        def coin(self, groups):
            for g in groups:
                for c in g.completions:
                    c.reward = flip()
            return []
        Scorer.score = coin
    timers.wrap(Scorer, "score", "reward")
    rss_start = C.rss_bytes()
    step_ends, step_cpu, parts, mem = [], [], [], None
    t_prev, c_prev = time.perf_counter(), time.process_time()
    for r in range(1, args.steps + 2):
        if r == 2:  # after the warm-up step
            mem = C.PeakMemory().__enter__()
            t_prev, c_prev = time.perf_counter(), time.process_time()
        timers.take()
        examples = rollout.round_examples(task, r, cfg.rollout.prompts_per_round, "node/0")
        groups = rollout.sample_groups(sampler, scorer, examples, cfg.rollout, seed=r)
        scorer.score(groups)
        n = sum(len(g.completions) for g in groups)
        stats = trainer.step(TrainBatch.from_groups(groups, policy.pad_id, own=[True] * n))
        t2, c2 = time.perf_counter(), time.process_time()
        if r >= 2:
            step_ends.append(t2 - t_prev)
            step_cpu.append(c2 - c_prev)
            parts.append({**timers.take(), "active_frac": stats["train/active_frac"],
                          "reward_mean": sum(c.reward for g in groups for c in g.completions) / n})
        t_prev, c_prev = t2, c2
    mem.__exit__(None, None, None)
    return {"step_s": step_ends, "step_cpu_s": step_cpu, "parts": parts, "rss_start": rss_start, "peak": mem.peak, "peak_base": mem.base}


# ------------------------------------------------------------------------------------------ TRL
def run_trl(args) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from swarm_node.config import ModelConfig
    from swarm_node.tasks.prompt import render_prompt
    from swarm_node.train.policy import Policy
    from swarm_node.train.presets import load_tokenizer

    cfg, task = task_and_config(args)
    train = task.split("train")
    # the prompt text exactly as our node renders it (a chat model's template and worked exchange
    # included), given to TRL as a plain string so that both sides condition on the same ids
    scorer = Policy.load(ModelConfig(name=args.model, device="cpu")).scorer(task)
    rows = [{"prompt": render_prompt(task, train[i], scorer.tokenizer, scorer.chat, scorer.system),
             "example_id": train[i].id} for i in range(2000)]
    dataset = Dataset.from_list(rows)
    flip = coin_reward(1)

    def arith_reward(prompts, completions, example_id, **kw):
        return [task.reward(c, task.example(e)) for c, e in zip(completions, example_id)]

    def coin(prompts, completions, **kw):
        return [flip() for _ in completions]

    state: dict = {"ends": [], "cpu": [], "mem": None, "parts": []}
    timers = common_timers()
    timers.wrap(GRPOTrainer, "_generate", "generate")
    timers.wrap(GRPOTrainer, "_calculate_rewards", "reward")
    timers.wrap(GRPOTrainer, "compute_loss", "forward (log-probs + loss)")

    class Timer(TrainerCallback):
        def on_train_begin(self, a, s, c, **kw):
            state["rss_start"] = C.rss_bytes()

        def on_step_end(self, a, s, c, **kw):
            now, cpu = time.perf_counter(), time.process_time()
            parts = timers.take()
            if s.global_step == 1:  # warm-up done: start measuring
                state["mem"] = C.PeakMemory().__enter__()
            else:
                state["ends"].append(now - state["t"])
                state["cpu"].append(cpu - state["c"])
                state["parts"].append(parts)
            state["t"], state["c"] = time.perf_counter(), time.process_time()

    with tempfile.TemporaryDirectory(prefix="bench-trl-") as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
            logging_steps=1, disable_tqdm=True, seed=0, data_seed=0, dataloader_num_workers=0,
            per_device_train_batch_size=cfg.train.micro_batch, gradient_accumulation_steps=24 // cfg.train.micro_batch,
            num_generations=cfg.rollout.group_size, max_completion_length=cfg.rollout.max_new_tokens,
            temperature=cfg.rollout.temperature, top_p=1.0, top_k=0, beta=0.0, num_iterations=1,
            epsilon=cfg.loss.eps, loss_type="grpo",
            scale_rewards="group", learning_rate=cfg.train.lr, weight_decay=cfg.train.weight_decay,
            max_grad_norm=cfg.train.max_grad_norm, lr_scheduler_type="constant", warmup_steps=0,
            max_steps=args.steps + 1, gradient_checkpointing=args.worker == "trl",
        )
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype="float32")
        trainer = GRPOTrainer(model=model, reward_funcs=[coin if args.scenario == "coin" else arith_reward], args=config,
                              train_dataset=dataset, processing_class=load_tokenizer(args.model), callbacks=[Timer()])
        trainer.train()
    state["mem"].__exit__(None, None, None)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    return {"step_s": state["ends"], "step_cpu_s": state["cpu"], "parts": state["parts"], "rss_start": state["rss_start"], "peak": state["mem"].peak,
            "peak_base": state["mem"].base, "log": logs,
            "config": {k: getattr(config, k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                      "generation_batch_size", "steps_per_generation", "num_generations",
                                                      "max_completion_length", "beta", "loss_type", "epsilon",
                                                      "gradient_checkpointing", "learning_rate", "max_grad_norm",
                                                      "scale_rewards", "top_k", "top_p", "temperature")}}


def worker(args) -> None:
    import resource

    import torch

    C.single_thread()
    torch.manual_seed(0)
    t = time.perf_counter()
    out = run_ours(args) if args.worker == "ours" else run_trl(args)
    out.update(side=args.worker, scenario=args.scenario, wall_s=time.perf_counter() - t,
               maxrss_lifetime=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps(out, default=str))


# ------------------------------------------------------------------------------------------ parent
def prepare_model(args) -> str:
    """The warm-started model directory both sides load (cached by swarm_node.train.warmstart)."""
    C.single_thread()
    from swarm_node.train.warmstart import warmstarted_model

    cfg, task = task_and_config(args)
    if not args.preset.startswith("tiny-"):  # a packaged pretrained model: its installed directory
        from swarm_node.train.models import resolve_model_name

        return resolve_model_name(args.preset)
    if args.warmstart_steps == 0:
        import tempfile as tf

        from swarm_node.train.policy import Policy

        path = tf.mkdtemp(prefix="bench-model-")
        Policy.load(cfg.model).save(path)
        return path
    t = time.perf_counter()
    path = warmstarted_model(cfg, task)
    print(f"warm-started model: {path} ({time.perf_counter() - t:.0f} s)")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", "--model-name", default="tiny-s",
                    help="tiny-s | tiny-m | tiny-l, or a packaged real model (smollm2-135m: no warm start; "
                         "use --max-new-tokens 24 --lr 1e-5 --warmstart-steps 0)")
    ap.add_argument("--warmstart-steps", type=int, default=600, help="supervised warm start (as tests/test_learning.py); 0 = random init")
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--steps", type=int, default=12, help="measured steps per run (after one warm-up step)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh-process runs per side and scenario, interleaved")
    ap.add_argument("--sides", nargs="+", default=["ours", "trl"], choices=SIDES,
                    help="trl-no-gc: TRL with gradient checkpointing off (GRPOConfig turns it on by default)")
    ap.add_argument("--scenarios", nargs="+", default=SCENARIOS, choices=SCENARIOS)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 measured steps, arith only, no trl-no-gc")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--scenario", default="arith", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.steps, args.scenarios, args.sides, args.repeats = 2, ["arith"], ["ours", "trl"], 1
    if args.worker:
        return worker(args)

    started, info = time.time(), C.machine_info()
    print(C.describe_load(info))
    if any(s.startswith("trl") for s in args.sides) and info["versions"]["trl"] is None:
        sys.exit("trl is not installed: .venv/bin/pip install -e '.[bench]'")
    model = prepare_model(args)
    common = ["--preset", args.preset, "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr),
              "--steps", str(args.steps), "--warmstart-steps", str(args.warmstart_steps), "--model", model]
    runs = []
    for rep in range(args.repeats):  # interleaved, alternating order, so load bursts hit both sides alike
        for scenario in args.scenarios:
            for side in (args.sides if rep % 2 == 0 else args.sides[::-1]):
                r = C.run_json_subprocess([__file__, "--worker", side, "--scenario", scenario, *common], timeout_s=600,
                                          env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
                r["repeat"] = rep
                runs.append(r)
                print(f"  {scenario:6s} {side:10s} repeat {rep + 1}: {C.median(r['step_s']):.3f} s/step "
                      f"(CPU {C.median(r['step_cpu_s']):.3f} s)  "
                      f"peak {r['peak'] / 2**20:.0f} MiB", flush=True)
    results = []  # pool the repeats: all measured steps, the largest peak
    for scenario in args.scenarios:
        for side in args.sides:
            mine = [r for r in runs if r["scenario"] == scenario and r["side"] == side]
            pooled = {**mine[0], "step_s": [x for r in mine for x in r["step_s"]],
                      "step_cpu_s": [x for r in mine for x in r["step_cpu_s"]],
                      "parts": [x for r in mine for x in r["parts"]], "peak": max(r["peak"] for r in mine),
                      "rss_start": max(r["rss_start"] for r in mine),
                      "maxrss_lifetime": max(r["maxrss_lifetime"] for r in mine), "repeats": len(mine),
                      "median_step_s_per_repeat": [C.median(r["step_s"]) for r in mine]}
            pooled["median_step_s"] = C.median(pooled["step_s"])
            pooled["median_step_cpu_s"] = C.median(pooled["step_cpu_s"])
            results.append(pooled)
    rows = []
    for scenario in args.scenarios:
        ours = next((r for r in results if r["scenario"] == scenario and r["side"] == "ours"), None)
        for r in results:
            if r["scenario"] != scenario:
                continue
            active = C.median([p["active_frac"] for p in r["parts"]]) if r["side"] == "ours" else 1.0
            rows.append([scenario, r["side"], 1e3 * r["median_step_s"], 1e3 * min(r["step_s"]), 1e3 * r["median_step_cpu_s"],
                         r["peak"] / 2**20, (r["peak"] - r["rss_start"]) / 2**20, active,
                         ours["median_step_s"] / r["median_step_s"] if ours else None,
                         ours["median_step_cpu_s"] / r["median_step_cpu_s"] if ours else None,
                         ours["peak"] / r["peak"] if ours else None])
            (r["ours_over_this_time"], r["ours_over_this_cpu_time"], r["ours_over_this_peak"]) = rows[-1][8:11]
    start = "warm-started" if args.preset.startswith("tiny-") else "pretrained, no warm start"
    C.print_table(f"One GRPO step on CPU, {args.preset} {start}, arith, 2 prompts x 12 completions, "
                  f"<= {args.max_new_tokens} tokens, micro-batch 8, 1 thread (median of {args.repeats} x {args.steps} steps)",
                  ["scenario", "side", "wall ms/step", "best wall ms", "CPU ms/step", "peak RSS MiB",
                   "peak above start MiB", "active seqs", "ours/this wall", "ours/this CPU", "ours/this peak RSS"], rows,
                  caption="medians over all measured steps; CPU = process CPU time per step (robust to other processes "
                          "on a shared box); peak RSS over the measured steps (VmHWM after a reset); 'above start': minus "
                          "the RSS when training began (model loaded); active seqs: share our trainer back-propagates")
    stages = ["generate", "reward", "forward (log-probs + loss)", "backward", "optimizer step (clip + AdamW)"]
    prow = []
    for r in results:  # means, so the stages add up to the mean step; CPU time of the calling thread
        avg = {k: sum(p.get("cpu/" + k, 0.0) for p in r["parts"]) / len(r["parts"]) for k in stages}
        r["mean_step_cpu_s"] = sum(r["step_cpu_s"]) / len(r["step_cpu_s"])
        r["mean_step_s"] = sum(r["step_s"]) / len(r["step_s"])
        r["mean_parts_cpu"] = {**avg, "other": r["mean_step_cpu_s"] - sum(avg.values())}
        r["mean_parts_wall"] = {k: sum(p.get(k, 0.0) for p in r["parts"]) / len(r["parts"]) for k in stages}
        prow.append([r["scenario"], r["side"], *[1e3 * v for v in r["mean_parts_cpu"].values()], 1e3 * r["mean_step_cpu_s"]])
    C.print_table("Where the step goes (CPU ms, mean over measured steps)", ["scenario", "side", *stages, "other", "step"],
                  prow, caption="forward = log-prob forward + loss (TRL: compute_loss); other = data loading, "
                                "advantages, logging, callbacks, Trainer bookkeeping, other threads; wall-time stages "
                                "are in the JSON (mean_parts_wall)")
    path = C.write_results("vs_trl", results, args, info, started, out=args.out, model_dir=model)
    print(f"wrote {C.shown(path)} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())

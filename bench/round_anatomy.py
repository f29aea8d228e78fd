"""Benchmark 2 — round anatomy: where a tiny-preset node's round time goes, alone and in a swarm.

Runs the real round loop (`swarm_node.node.run`) in worker processes, with timers wrapped around
the library's functions from the outside (no library edits): per round, seconds in

  generate   Policy.generate (sampling 2 prompts x 12 completions; 4 for a real model)
  reward     Scorer.score on our own completions (decoding included)
  exchange   Exchange.round, split into encode / offer (DHT record publish) / collect (DHT lookups,
             waiting for peers, fetching) / accept (decode, validate, re-score peers' packets) /
             peer lookups (HivemindTransport.peers)
  logprob    Policy.completion_logprobs forward (training log-probs, with grad)
  loss       loss.policy_loss
  backward   Tensor.backward (includes the checkpointed chunks' recompute)
  step       clip_grad_norm_ + AdamW.step
  eval       greedy pass@1 on the held-out set (eval_every=1 here so every round has one)

Three configurations, one after the other in one run:
  alone      `swarm-node train`: no network, the exchange stage is skipped
  swarm-1    one `join` node with the transport up but no peers (swarm.min_peers=0): the fixed
             transport cost of a round
  swarm-3    three `join` nodes on 127.0.0.1 sharing this machine's cores (library defaults:
             min_peers=1, deadline 30 s, vertical mode, staleness 2)
Round 1 is a warm-up (nodes start at different times) and is excluded; medians over the rest.

    .venv/bin/python bench/round_anatomy.py                # ~2-3 min on 2 cores (+ warm start on first use)
    .venv/bin/python bench/round_anatomy.py --preset tiny-l
    .venv/bin/python bench/round_anatomy.py --device cuda  # on a GPU machine
    .venv/bin/python bench/round_anatomy.py --model smollm2-135m --modes alone  # a real model's round (make models)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402

PARTS = ["generate", "reward", "exchange", "exchange/encode", "exchange/offer", "exchange/collect",
         "exchange/accept", "logprob", "loss", "backward", "step", "eval"]
TOP = ["generate", "reward", "exchange", "logprob", "loss", "backward", "step", "eval"]
CPU_PARTS = ["generate", "reward", "exchange", "logprob", "loss", "backward", "step", "eval"]


def is_real(args) -> bool:
    """A pretrained model (smollm2-135m, ...) rather than a tiny random-init preset."""
    return not args.preset.startswith("tiny-")


def node_overrides(args, out: str, swarm: bool, min_peers: int | None = None) -> list[str]:
    o = [f"model.name={args.preset}", f"model.device={args.device}", f"rollout.prompts_per_round={args.prompts}"]
    # a tiny model learns 2-digit sums after its warm start; a real one gets bench/real_model.py's task, no warm start
    o += [] if is_real(args) else ["task.options={digits: 2, second_digits: 1}"]
    o += [f"train.warmstart_steps={args.warmstart_steps}", f"train.rounds={args.rounds}", "train.eval_every=1",
         "train.checkpoint_every=0", f"rollout.max_new_tokens={args.max_new_tokens}", f"task.eval_limit={args.eval_limit}",
         f"threads={args.threads}", f"out={out}", "train.lr=1e-5"]
    if swarm:
        if args.min_peers is not None and min_peers is None:
            min_peers = args.min_peers
        o += ["swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]", f"swarm.run_id={args.run_id}",
              "swarm.linger_s=0"]  # the workers wait for each other before leaving instead
        if min_peers is not None:
            o.append(f"swarm.min_peers={min_peers}")
    return o


# ------------------------------------------------------------------------------------------ worker
def worker(args) -> None:
    """One node: node.run with timers wrapped around the library's stages; rows -> args.result."""
    import torch

    import swarm_node.node as node_mod
    import swarm_node.swarm.admit as admit_mod
    import swarm_node.swarm.exchange as exchange_mod
    import swarm_node.train.trainer as trainer_mod
    from swarm_node.config import load_config
    from swarm_node.tasks.scoring import Scorer
    from swarm_node.train.policy import Policy
    from swarm_node.train.sampling.hf import HFSampler

    timers = C.Timers(sync=torch.cuda.synchronize if args.device.startswith("cuda") else None)
    where = {"eval": False, "admit": False}
    check = admit_mod.Admission.check

    def admitting(self, *a, **kw):  # peers' completions are scored inside Admission.check
        where["admit"] = True
        try:
            return check(self, *a, **kw)
        finally:
            where["admit"] = False
    admit_mod.Admission.check = admitting
    for owner, attr, key in [
        (HFSampler, "_generate", lambda a: "eval/generate" if where["eval"] else "generate"),
        (Policy, "completion_logprobs", "logprob"),
        (Scorer, "score", lambda a: "exchange/peer_reward" if where["admit"] else "reward"),
        (trainer_mod, "policy_loss", "loss"),
        (torch.Tensor, "backward", "backward"),
        (torch.nn.utils, "clip_grad_norm_", "step"),
        (torch.optim.AdamW, "step", "step"),
        (exchange_mod, "encode", "exchange/encode"),
        (admit_mod.Admission, "check", "exchange/accept"),
        (exchange_mod.Exchange, "offer", "exchange"),
        (exchange_mod.Exchange, "collect", "exchange"),
    ]:
        timers.wrap(owner, attr, key)
    if args.swarm:  # the transport (hivemind) only where a swarm runs: `alone` works without it installed
        from swarm_node.net.hivemind import HivemindTransport
        timers.wrap(HivemindTransport, "offer", "exchange/offer")
        timers.wrap(HivemindTransport, "collect", "exchange/collect")  # peer lookups happen inside collect
    pass_at_1 = node_mod.pass_at_1

    def eval_wrapper(*a, **kw):
        where["eval"] = True
        try:
            return pass_at_1(*a, **kw)
        finally:
            where["eval"] = False
    node_mod.pass_at_1 = eval_wrapper

    if args.swarm:  # publish our address for the parent; on exit wait for the others before going away
        start, close = HivemindTransport.start, exchange_mod.Exchange.close

        def start_and_tell(self):
            start(self)
            Path(args.result + ".maddr").write_text(self.join_addrs()[0])

        def close_after_peers(self, *a, **kw):  # a barrier instead of a fixed linger: leave once all are done
            Path(args.result + ".done").write_text("1")
            deadline = time.time() + 60
            while time.time() < deadline and len(list(Path(args.result).parent.glob("*.done"))) < args.nodes:
                time.sleep(0.2)
            close(self, *a, **kw)
        HivemindTransport.start, exchange_mod.Exchange.close = start_and_tell, close_after_peers

    rows = []

    cpu_mark = [time.process_time()]

    def on_round(row):  # per round: stage timers, and the node process's CPU time (all its threads)
        now = time.process_time()
        rows.append({**row, **{f"t/{k}": v for k, v in timers.take().items()}, "t/process_cpu": now - cpu_mark[0]})
        cpu_mark[0] = now

    cfg = load_config(None, args.overrides)
    connect = (lambda model_id, tok: HivemindTransport(cfg.swarm, model_id, tok)) if args.swarm else None
    node_mod.run(cfg, connect=connect, on_round=on_round)
    Path(args.result).write_text(json.dumps(rows))


# ------------------------------------------------------------------------------------------ parent
def spawn(args, tmp: Path, name: str, overrides: list[str], nodes: int, swarm: bool) -> tuple[subprocess.Popen, Path]:
    result = tmp / f"{name}.json"
    argv = [C.PYTHON, __file__, "--worker", "--result", str(result), "--nodes", str(nodes), "--device", args.device]
    argv += ["--swarm"] if swarm else []
    argv += ["--overrides", *overrides]
    log = open(tmp / f"{name}.log", "w")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=C.REPO), result


def wait_all(procs: list[subprocess.Popen], timeout_s: float, tmp: Path) -> None:
    deadline = time.time() + timeout_s
    for p in procs:
        try:
            p.wait(max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
    bad = [p for p in procs if p.returncode != 0]
    if bad:
        logs = "\n".join(f"--- {f.name}\n{f.read_text()[-2500:]}" for f in sorted(tmp.glob("*.log")))
        raise RuntimeError(f"{len(bad)} worker(s) failed:\n{logs}")


def run_config(args, tmp: Path, mode: str) -> list[list[dict]]:
    """Per node, its metric rows (one per round)."""
    sub = tmp
    if mode == "alone":
        p, res = spawn(args, sub, "node0", node_overrides(args, str(sub / "out0"), False), 1, False)
        wait_all([p], args.timeout, sub)
        return [json.loads(res.read_text())]
    if mode == "swarm-1":
        p, res = spawn(args, sub, "node0", node_overrides(args, str(sub / "out0"), True, min_peers=0), 1, True)
        wait_all([p], args.timeout, sub)
        return [json.loads(res.read_text())]
    n = args.nodes
    p0, r0 = spawn(args, sub, "node0", node_overrides(args, str(sub / "out0"), True), n, True)
    procs, results = [p0], [r0]
    deadline = time.time() + 120
    maddr_file = Path(str(r0) + ".maddr")
    while not maddr_file.exists():
        if time.time() > deadline or p0.poll() is not None:
            wait_all(procs, 1, sub)
            raise RuntimeError("first node did not publish its address")
        time.sleep(0.2)
    maddr = maddr_file.read_text().strip()
    for i in range(1, n):
        o = node_overrides(args, str(sub / f"out{i}"), True) + [f"swarm.peers=[{maddr}]", f"train.seed={i}",
                                                                 f"name=node{i}"]
        p, r = spawn(args, sub, f"node{i}", o, n, True)
        procs.append(p)
        results.append(r)
    wait_all(procs, args.timeout, sub)
    return [json.loads(r.read_text()) for r in results]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(node_rows: list[list[dict]], skip: int) -> dict:
    """Mean over measured rounds per node (so the parts add up to the mean round), then over nodes.
    Means, not medians: training only runs when a group has mixed rewards, so a median round of a
    weak tiny model can show zero training time."""
    per_node = []
    for rows in node_rows:
        rounds = [r for r in rows if r["round"] > skip and "time/round_s" in r and r["round"] > 0]
        part = {}
        for k in PARTS:
            if k == "exchange":
                vals = [r.get("time/exchange_s", 0.0) for r in rounds]
            elif k == "eval":
                vals = [r.get("time/eval_s", 0.0) for r in rounds]
            elif k == "exchange/accept":  # accept includes the peer re-scoring
                vals = [r.get("t/exchange/accept", 0.0) for r in rounds]
            else:
                vals = [r.get(f"t/{k}", 0.0) for r in rounds]
            part[k] = mean(vals)
        part["round"] = mean([r["time/round_s"] for r in rounds])
        part["round_without_eval"] = mean([r["time/round_s"] - r.get("time/eval_s", 0.0) for r in rounds])
        part["round_median"] = C.median([r["time/round_s"] for r in rounds])
        part["other"] = part["round"] - sum(part[k] for k in TOP)
        for k in ("swarm/packets_accepted", "swarm/bytes_in", "swarm/bytes_out", "swarm/packet_bytes_out", "swarm/peers",
                  "swarm/tokens_in", "train/sequences", "train/active_frac"):
            vals = [r[k] for r in rounds if k in r]
            part[k] = mean(vals) if vals else None
        for k in CPU_PARTS:  # CPU time of the node's main thread in each stage
            src = "t/cpu/eval/generate" if k == "eval" else f"t/cpu/{k}"
            part[f"cpu/{k}"] = mean([r.get(src, 0.0) for r in rounds])
        part["cpu/process"] = mean([r.get("t/process_cpu", 0.0) for r in rounds])
        part["rounds_measured"] = len(rounds)
        per_node.append(part)
    avg = {}
    for k in per_node[0]:
        vals = [p[k] for p in per_node if p[k] is not None]
        avg[k] = sum(vals) / len(vals) if vals else None
    return {"mean_over_nodes": avg, "per_node": per_node}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", "--model", default="tiny-s",
                    help="tiny-s | tiny-m | tiny-l, or a real model (smollm2-135m: no warm start, 4 prompts, "
                         "24 new tokens, 100 held-out problems unless given)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per round (default 2; 4 for a real model)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per node; round 1 is a warm-up and excluded")
    ap.add_argument("--nodes", type=int, default=3, help="nodes in the local swarm")
    ap.add_argument("--modes", nargs="+", default=["alone", "swarm-1", "swarm-3"], choices=["alone", "swarm-1", "swarm-3"])
    ap.add_argument("--min-peers", type=int, default=None, help="swarm.min_peers for the swarm (default: the library's)")
    ap.add_argument("--warmstart-steps", type=int, default=None,
                    help="600 for a tiny preset, as tests/test_learning.py (mixed rewards); 0 for a real model")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="10 (tiny) or 24 (real)")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out examples per eval: 200 (tiny), 100 (real)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per node (the node's `threads` setting)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds before a configuration's workers are killed")
    ap.add_argument("--repeats", type=int, default=2, help="run every configuration this many times, interleaved")
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 rounds, 1 repeat")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--swarm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--overrides", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    real = is_real(args)
    for key, tiny, pretrained in [("prompts", 2, 4), ("warmstart_steps", 600, 0), ("max_new_tokens", 10, 24),
                                  ("eval_limit", 200, 100)]:
        if getattr(args, key) is None:
            setattr(args, key, pretrained if real else tiny)
    if args.quick:
        args.rounds, args.repeats = 3, 1
    args.run_id = f"bench-anatomy-{os.getpid()}"
    started, info = time.time(), C.machine_info()
    print(C.describe_load(info))
    if args.warmstart_steps:  # warm start once (cached), not in every worker
        C.single_thread()
        from swarm_node.config import load_config
        from swarm_node.tasks import load_task
        from swarm_node.train.warmstart import warmstarted_model

        cfg = load_config(None, node_overrides(args, "/tmp/unused", False))
        t = time.perf_counter()
        print("warm-started model:", warmstarted_model(cfg, load_task(cfg.task.name, cfg.task.data, **cfg.task.options)),
              f"({time.perf_counter() - t:.0f} s)")
    summaries, raw = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-anatomy-") as tmp:
        for rep in range(args.repeats):  # interleaved (A B C A B C) so load drift hits every configuration alike
            for mode in args.modes:
                t = time.perf_counter()
                mode_key = mode if mode != "swarm-3" else f"swarm-{args.nodes}"
                (Path(tmp) / f"{mode}-{rep}").mkdir()
                nodes = run_config(args, Path(tmp) / f"{mode}-{rep}", mode)
                raw.setdefault(mode_key, []).extend(nodes)
                rnd = summarize(nodes, skip=1)["mean_over_nodes"]["round"]
                print(f"  {mode_key} (repeat {rep + 1}): {rnd:.3f} s/round ({time.perf_counter() - t:.0f} s)", flush=True)
    summaries = {k: summarize(v, skip=1) for k, v in raw.items()}
    modes = list(summaries)
    swarm_n = next((m for m in modes if m.startswith("swarm-") and m != "swarm-1"), None)
    m = {k: summaries[k]["mean_over_nodes"] for k in modes}
    rows = []
    for k in TOP[:2] + ["exchange", "exchange/encode", "exchange/offer", "exchange/collect",
                        "exchange/accept"] + TOP[3:-1] + ["other", "round_without_eval", "eval", "round"]:
        vals = [1e3 * m[mode][k] if not (mode == "alone" and k.startswith("exchange")) else None for mode in modes]
        ratio = None
        if swarm_n and "alone" in m and m["alone"].get(k) and not k.startswith("exchange"):
            ratio = m[swarm_n][k] / m["alone"][k]
        elif swarm_n and "swarm-1" in m and k.startswith("exchange") and m["swarm-1"].get(k):
            ratio = m[swarm_n][k] / m["swarm-1"][k]
        label = k if not k.startswith("exchange/") else "  " + k.split("/", 1)[1]
        cpu = [1e3 * m[mode][f"cpu/{k}"] if f"cpu/{k}" in m[mode] and not (mode == "alone" and k == "exchange")
               else None for mode in (modes[0], modes[-1])]
        cpu_ratio = cpu[1] / cpu[0] if None not in cpu and cpu[0] else None
        rows.append([label, *vals, ratio, *cpu, cpu_ratio])
    rows.append(["process CPU (all threads)", *[None] * (len(modes) + 1),
                 1e3 * m[modes[0]]["cpu/process"], 1e3 * m[modes[-1]]["cpu/process"],
                 m[modes[-1]]["cpu/process"] / m[modes[0]]["cpu/process"]])
    for k in ("train/sequences", "train/active_frac"):
        vals = [m[mode].get(k) for mode in modes]
        rows.append([k, *vals, vals[-1] / vals[0] if vals[0] else None, None, None, None])
    print(f"Round anatomy: {args.preset} on {args.device}, arith, {args.prompts} prompts x 12 completions, <= {args.max_new_tokens} "
          f"tokens, greedy eval of {args.eval_limit} examples every round, {args.threads} thread(s) per node; "
          f"ms per round, mean over rounds 2..{args.rounds}, nodes and {args.repeats} interleaved repeat(s)")
    C.print_table("Round anatomy (milliseconds per round)",
                  ["part", *[f"{mode} wall" for mode in modes], f"{swarm_n}/alone" if swarm_n else "ratio",
                   f"{modes[0]} CPU", f"{modes[-1]} CPU", "CPU ratio"], rows,
                  caption="wall ratio: vs alone for compute parts, vs swarm-1 (transport up, no peers) for the exchange parts; "
                          "CPU = the node's main-thread CPU time in the stage (robust to contention; the transport's "
                          "own thread and p2pd are only in 'process CPU' / not at all); "
                          "'other' = round - listed parts (prompt encoding, merge, metrics); train/sequences includes "
                          "peers' completions (swarm.max_peer_groups caps them)")
    if swarm_n:
        s = m[swarm_n]
        print(f"{swarm_n}: exchange is {100 * s['exchange'] / s['round']:.0f}% of the round; "
              f"packets accepted/round {s['swarm/packets_accepted']}, bytes in/out per round "
              f"{s['swarm/bytes_in']:.0f}/{s['swarm/bytes_out']:.0f}, own packet {s['swarm/packet_bytes_out']:.0f} B, "
              f"training sequences/round {s['train/sequences']:.0f}")
    path = C.write_results(f"round_anatomy_{args.preset}_{args.device}", {"summary": summaries, "rows": raw},
                           args, info, started, out=args.out)
    print(f"wrote {C.shown(path)} ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())

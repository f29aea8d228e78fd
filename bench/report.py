"""Render the Markdown tables of docs/BENCHMARKS.md from bench/results/*.json (no measuring).

    .venv/bin/python bench/report.py            # all results present
    .venv/bin/python bench/report.py scale      # one of them

The tables in the doc are this script's output, so they always match the committed JSON.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `bench` as a package from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from bench import _common as C  # noqa: E402

RESULTS = C.RESULTS_DIR


def md(columns: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|"]
    out += ["| " + " | ".join(C.fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def header(d: dict) -> str:
    m = d["machine"]
    la, lb = m["load_avg_1_5_15"], d["load_avg_at_end"]
    return (f"`{d['command']}` — {d['wall_s']:.0f} s wall, {d['started_at']}; load average (1/5/15 min) "
            f"{la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f} at start, {lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f} at end "
            f"on {m['cpu_count']} CPUs")


def codec(d: dict) -> str:
    rs = d["results"]
    size = md(["scenario", "completion tokens", "packet bytes", "bytes / completion token", "overhead %",
               "prompts B", "header + groups B", "B per completion", "JSON form bytes / token"],
              [[r["scenario"], r["completion_tokens"], r["packet_bytes"], r["bytes_per_completion_token"],
                100 * r["overhead_frac"], r["prompt_bytes"], r["header_and_group_framing_bytes"],
                r["framing_bytes_per_completion"], r["json_bytes_per_completion_token"]] for r in rs])
    ops = list(rs[0]["timings"])
    thr = md(["operation", *[f"{r['scenario']} tokens/s" for r in rs], *[f"{r['scenario']} x memcpy" for r in rs]],
             [[op, *[r["timings"][op]["tokens_per_s"] for r in rs], *[r["timings"][op]["x_memcpy_time"] for r in rs]]
              for op in ops])
    ms = md(["operation", *[f"{r['scenario']} best ms" for r in rs], *[f"{r['scenario']} median ms" for r in rs]],
            [[op, *[1e3 * r["timings"][op]["min_s"] for r in rs], *[1e3 * r["timings"][op]["median_s"] for r in rs]]
             for op in ops])
    return f"{header(d)}\n\n{size}\n\n{thr}\n\n{ms}"


def logprob(d: dict) -> str:
    a = d["args"]
    rows = [[r["variant"], r["delta_bytes"] / 2**20, r["x_ours_memory"], r["seconds"], r["x_ours_time"],
             r["logp_max_abs_diff"], r["grad_max_rel_diff"]] for r in d["results"]]
    return (f"{header(d)}\n\nB={a['batch']}, prompt {a['prompt']}, T={a['tokens']}, V={a['vocab']:,}, hidden {a['hidden']}, "
            f"{a['layers']} layers, fp32, 1 thread; [B,T,V] fp32 logits = {d['logits_btv_bytes'] / 2**20:,.0f} MiB; "
            f"baseline RSS (model + batch) {d['results'][0]['baseline_bytes'] / 2**20:,.0f} MiB\n\n"
            + md(["variant", "peak above baseline MiB", "x ours", "fwd+bwd s", "x ours", "max abs dlogp vs naive",
                  "max rel dgrad vs naive"], rows))


def vs_trl(d: dict) -> str:
    rows, parts = [], []
    stages = None
    for r in d["results"]:
        active = C.median([p["active_frac"] for p in r["parts"]]) if r["side"] == "ours" else 1.0
        rows.append([r["scenario"], r["side"], 1e3 * r["median_step_s"], 1e3 * min(r["step_s"]),
                     1e3 * r["median_step_cpu_s"], r["peak"] / 2**20, (r["peak"] - r["rss_start"]) / 2**20, active,
                     r["ours_over_this_time"], r["ours_over_this_cpu_time"], r["ours_over_this_peak"]])
        stages = list(r["mean_parts_cpu"])
        parts.append([r["scenario"], r["side"], *[1e3 * v for v in r["mean_parts_cpu"].values()], 1e3 * r["mean_step_cpu_s"]])
    a = d["args"]
    return (f"{header(d)}\n\n{a['preset']} warm-started ({a['warmstart_steps']} steps), {a['repeats']} fresh-process runs x "
            f"{a['steps']} measured steps per side and scenario, interleaved; medians over all measured steps\n\n"
            + md(["scenario", "side", "wall ms/step", "best wall ms", "CPU ms/step", "peak RSS MiB",
                  "peak above start MiB", "active seqs", "ours/this wall", "ours/this CPU", "ours/this peak RSS"], rows)
            + "\n\nCPU ms per step by stage (mean; main thread):\n\n" + md(["scenario", "side", *stages, "step"], parts))


def anatomy(d: dict) -> str:
    summ = d["results"]["summary"]
    modes = list(summ)
    m = {k: summ[k]["mean_over_nodes"] for k in modes}
    swarm_n = next((k for k in modes if k.startswith("swarm-") and k != "swarm-1"), None)
    keys = ["generate", "reward", "exchange", "exchange/encode", "exchange/offer", "exchange/collect", "exchange/accept",
            "exchange/peer_lookups", "logprob", "loss", "backward", "step", "other", "round_without_eval", "eval", "round"]
    first, last = modes[0], modes[-1]
    rows = []
    for k in keys:
        vals = [1e3 * m[mode][k] if not (mode == "alone" and k.startswith("exchange")) else None for mode in modes]
        if k.startswith("exchange"):
            ratio = m[swarm_n][k] / m["swarm-1"][k] if swarm_n and "swarm-1" in m and m["swarm-1"][k] else None
        else:
            ratio = m[swarm_n][k] / m["alone"][k] if swarm_n and "alone" in m and m["alone"][k] else None
        cpu = [1e3 * m[mode][f"cpu/{k}"] if f"cpu/{k}" in m[mode] and not (mode == "alone" and k == "exchange") else None
               for mode in (first, last)]
        cpu_ratio = cpu[1] / cpu[0] if None not in cpu and cpu[0] else None
        label = f"&nbsp;&nbsp;{k.split('/', 1)[1]}" if k.startswith("exchange/") else k.replace("_", " ")
        rows.append([label, *vals, ratio, *cpu, cpu_ratio])
    rows.append(["process CPU, all threads", *[None] * (len(modes) + 1), 1e3 * m[first]["cpu/process"],
                 1e3 * m[last]["cpu/process"], m[last]["cpu/process"] / m[first]["cpu/process"]])
    for k in ("train/sequences", "train/active_frac", "swarm/packets_accepted", "swarm/bytes_in", "swarm/bytes_out"):
        rows.append([k, *[m[mode].get(k) for mode in modes], None, None, None, None])
    a = d["args"]
    return (f"{header(d)}\n\n{a['preset']} on {a['device']}, {a['threads']} thread(s) per node, {a['repeats']} interleaved "
            f"repeats x {a['rounds']} rounds (round 1 excluded); ms per round, mean over rounds and nodes\n\n"
            + md(["part (ms / round)", *[f"{mode} wall" for mode in modes], f"{swarm_n} / alone wall (exchange: / swarm-1)",
                  f"{first} CPU", f"{last} CPU", "CPU ratio"], rows))


def scale(d: dict) -> str:
    import scale as _scale

    return f"{header(d)}\n\n{_scale.markdown(d, md)}"


def discovery_sim(d: dict) -> str:
    import discovery_sim as _sim

    return f"{header(d)}\n\n{_sim.markdown(d, md)}"


RENDER = {"codec_throughput": codec, "logprob_memory": logprob, "vs_trl": vs_trl, "scale": scale,
          "discovery_sim": discovery_sim}


def main() -> None:
    want = sys.argv[1:]
    for path in sorted(RESULTS.glob("*.json")):
        name = path.stem
        kind = "round_anatomy" if name.startswith("round_anatomy") else name
        if want and not any(w in name for w in want):
            continue
        render = anatomy if kind == "round_anatomy" else RENDER.get(kind)
        if render is None:
            continue
        print(f"## {name}\n\n{render(json.loads(path.read_text()))}\n")


if __name__ == "__main__":
    main()

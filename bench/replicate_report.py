"""The report of the replication study (docs/REPLICATION.md): the miniature's claims, then the
real-model study's, each with its verdict, tables, figures and off-policy statistics.

bench/replicate.py runs the miniature's arms (bench/replicate_study.py) and then calls `render`
here; `python bench/replicate.py --render` only redraws the document from the cached per-run JSON
(bench/results/replication/, the real model's under real/). Numbers and verdicts: bench/replicate_stats.py.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from bench.replicate_stats import (CLAIMS, DELTA, OPEN_CHECK, REAL_CLAIMS, ci95, diffs, load, load_real, mean_se,
                                   mechanism, pct, values, verdict)
from bench.replicate_study import (DOC, FULL, IMG, PAIRS, REAL_FOLDERS, REAL_PAIRS, REAL_ROUNDS, REAL_WARM_STEPS,
                                   Scale)


# ---------------------------------------------------------------------------------- report
NOTES = {  # why a claim may behave differently in miniature; the numbers are in the tables
    1: "NoIS trains on a peer's samples as if they were the receiver's own (one optimizer step per round: "
       "R = 1 and nothing corrects for pi_gen). That can only hurt when the samples are far off-policy for "
       "the receiver; is/ratio_* (pi_theta / pi_gen over the step's tokens) in the table above shows how far: "
       "a mean near 1 with extremes of tens to hundreds means a few tokens per step are very unlikely under "
       "the receiver, a much smaller gap than between Qwen2.5-1.5B and 3B.",
    2: "The filter removes the advantage of a peer's negative-advantage sequences whose divergence D >= g "
       "(filter/dropped_frac above). If NoIS does no measurable harm there is nothing to recover, and the "
       "verdict says so.",
    3: "With one optimizer step per round, VIS clips pi_theta / pi_gen to [1 - eps, 1 + eps]: peer tokens "
       "outside it give no gradient; TIS keeps them, weighted by min(ratio, C). Own samples are on-policy "
       "either way, so the two can only differ through the peer half of each batch.",
    4: "'early' = the first evaluation after the start (round eval_every), for 'initially slower'. OOD = a "
       "second operand of 10..99 (training never goes above 9), evaluated from each node's final checkpoint "
       "by this script. These models score about 1 % there before and after RL, so 'sometimes better out of "
       "distribution' cannot be resolved at this floor.",
    5: "Horizontal as the paper defines it: both nodes answer the same 2 prompts each round, each generating "
       "6 of every group's G = 12 completions, and the halves merge into groups of 12 from two policies "
       "(advantages mix both nodes' rewards), 24 sequences a step; vertical: each node answers its own "
       "prompt and trains on 1 own + 1 peer group of 12. Both generate 12 completions a round per node.",
    "4-open": "Not one of the paper's claims: the check that the project's defences against poisoning peers "
              "(issue 26) leave honest collaboration intact. f-tis-open is the f-tis arm with loss.C_negative, "
              "loss.positive_floor, loss.peer_negative_weight, loss.peer_plausibility_margin and "
              "loss.peer_max_advantage at their "
              "defaults instead of the paper's values; everything else is the same.",
    6: "g only acts on negative-advantage peer sequences; the dropped fraction per g shows how many it "
       "removes. A smaller g drops more, but too few sequences change for accuracy to move measurably here.",
}


SUFFIX = {"final": "", "early": " early", "ood": " OOD"}
YLABEL = {"final": "final held-out", "early": "early (1st eval) held-out", "ood": "final OOD"}


def _per_node(res: dict, claim, nodes: dict = PAIRS) -> str:
    """One line: each node's seed-paired difference of the claim's effect with its 95% interval."""
    _, _, _, pairs, _, (arm, base) = claim
    parts = []
    for p in pairs:
        for n in nodes[p]:
            d = diffs(res, [(p, n)], arm, base)
            if len(d) >= 2:
                lo, hi = ci95(d)
                parts.append(f"{p}/{n} {100 * mean_se(d)[0]:+.1f} ({100 * lo:+.1f} .. {100 * hi:+.1f})")
    return f"Per node, {arm} − {base} (points, 95% CI): " + ("; ".join(parts) or "not run yet") + "."


def _rows(res: dict, claim, nodes: dict = PAIRS, start: str = "warm start") -> list[str]:
    number, _, arms, pairs, _, (_, base) = claim
    keys = ["early", "final", "ood"] if number == 4 else ["final"]
    keys = [k for k in keys if any(values(res, p, a, n, k) for p in pairs for n in nodes[p] for a in arms)]
    head = ["pair", "node", start] + [f"{a}{SUFFIX[k]}" for k in keys for a in arms]
    head += [f"{a} − {base}{SUFFIX[k]} (paired)" for k in keys for a in arms if a != base]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for pair in pairs:
        for node in nodes[pair]:
            starts = [v for a in arms for v in values(res, pair, a, node, "start").values()]
            cells = [pair, node, pct(starts[0]) if starts else "not run yet"]
            cells += [pct(*mean_se(list(values(res, pair, a, node, k).values()))) for k in keys for a in arms]
            cells += [pct(*mean_se(diffs(res, [(pair, node)], a, base, k)), signed=True)
                      for k in keys for a in arms if a != base]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


MECHANISM_HEAD = ["| pair | node | arm | filtered | truncated | ratio mean | ratio min | ratio max | peer groups/step |",
                  "|---|---|---|---:|---:|---:|---:|---:|---:|"]


def _mechanism_rows(res: dict, arms: list[str], units: list[tuple[str, str]]) -> list[str]:
    """One table row per (pair, node) of `units` and arm with metrics: what explains a result."""
    lines = []
    for pair, node in units:
        for arm in arms:
            m = mechanism(res, pair, arm, node)
            if all(math.isnan(v) for v in m.values()):
                continue
            f = [f"{m[k]:.3f}" if not math.isnan(m[k]) else "–" for k in m]
            lines.append(f"| {pair} | {node} | {arm} | " + " | ".join(f) + " |")
    return lines


def figure(res: dict, claim, path: Path, nodes: dict = PAIRS, start: str = "warm start") -> bool:
    """Bars (mean +- SE, seeds as dots) of final held-out accuracy per node and arm; False if no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    number, _, arms, pairs, _, _ = claim
    units = [(p, n) for p in pairs for n in nodes[p] if any(values(res, p, a, n) for a in arms)]
    keys = [k for k in (["early", "final", "ood"] if number == 4 else ["final"])
            if any(values(res, p, a, n, k) for p, n in units for a in arms)]
    if not any(values(res, p, a, n) for p, n in units for a in arms):
        return False
    fig, axes = plt.subplots(len(keys), 1, figsize=(max(6.0, 1.4 * len(units) + 2), 3.2 * len(keys)), squeeze=False)
    width = 0.8 / len(arms)
    for ax, key in zip(axes[:, 0], keys):
        for j, arm in enumerate(arms):
            for i, (p, n) in enumerate(units):
                v = list(values(res, p, arm, n, key).values())
                m, se, _ = mean_se(v)
                x = i + (j - (len(arms) - 1) / 2) * width
                ax.bar(x, 100 * m if v else 0, width, yerr=100 * se if len(v) > 1 else 0, color=f"C{j}",
                       label=arm if i == 0 else None, capsize=3)
                ax.plot([x] * len(v), [100 * y for y in v], "k.", ms=4)
        for i, (p, n) in enumerate(units):
            starts = [v for a in arms for v in values(res, p, a, n, "start").values()]
            if starts and key != "ood":
                ax.hlines(100 * starts[0], i - 0.45, i + 0.45, colors="k", linestyles="--", lw=1,
                          label=start if i == 0 else None)
        ax.set_xticks(range(len(units)), [f"{p}\n{n}" for p, n in units], fontsize=8)
        ax.set_ylabel(f"{YLABEL[key]} pass@1 (%)")
        ax.legend(fontsize=8)
    fig.suptitle(f"Claim {number}: {claim[1][:90]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(scale: Scale) -> None:
    res = load(scale)
    aside = scale.results != FULL.results  # a smoke run or a re-run in another folder: its own page
    doc, img = (scale.results / "REPLICATION.md", scale.results / "img") if aside else (DOC, IMG)
    img.mkdir(parents=True, exist_ok=True)
    verdicts = [(c, *verdict(res, c)) for c in CLAIMS]
    count = {v: sum(x[1] == v for x in verdicts) for v in
             ("reproduced", "not reproduced", "inconclusive at this scale", "not run yet")}
    seeds = sorted({seed for (_, _, seed) in res})
    per_arm = {arm: len({seed for (_, a, seed) in res if a == arm}) for (_, arm, _) in res}  # seeds run per arm
    fewest, most = min(per_arm.values(), default=0), max(per_arm.values(), default=0)
    seed_count = (f"{most} seed(s)" if fewest == most else f"{fewest} seeds per arm, {most} for "
                  + ", ".join(sorted(a for a, n in per_arm.items() if n == most)))
    warm_file = scale.results / "warm-ood.json"
    warm = json.loads(warm_file.read_text()) if warm_file.exists() else {}
    runs = {(d["arm"], d["seed"], d["seconds"]) if d["arm"] == "alone" else (d["pair"], d["arm"], d["seed"]):
            d["seconds"] for d in (json.loads(p.read_text()) for p in scale.results.glob("*-s*.json"))}
    minutes = sum(runs.values()) / 60
    summary = (f"In miniature (tiny presets on arith, {seed_count}, {scale.rounds} rounds): "
               + ", ".join(f"{n} {k}" for k, n in count.items() if n) + " of the paper's 6 claims: "
               + "; ".join(f"({c[0]}) {v}" for c, v, _ in verdicts) + ".")
    real_summary, real = ("", []) if aside else real_section(res, img, doc)
    if real_summary:
        summary += (f" On a real pretrained model ([below](#on-a-real-pretrained-model-smollm2-135m-instruct-full-"
                    f"fine-tuning--lora-r--128); SmolLM2-135M, full + LoRA, {REAL_ROUNDS} rounds): {real_summary}.")
    out = ["# The paper's claims, re-tested in miniature and on a real model", "", f"**Summary:** {summary}", "",
           f"Generated by `python bench/replicate.py` from the JSON in `{os.path.relpath(scale.results, DOC.parent.parent)}/` "
           "(`--render` redraws without running anything). " + _SETUP.format(
               rounds=scale.rounds, eval_every=scale.eval_every or scale.rounds, n=scale.eval_limit,
               ood=scale.ood_limit, seeds=", ".join(map(str, seeds)) or "none yet", minutes=minutes,
               delta=100 * DELTA, warm=", ".join(f"{k} {100 * v:.1f}%" for k, v in warm.items())), "",
           ]
    for claim, v, effect in [*verdicts[:4], (OPEN_CHECK, *verdict(res, OPEN_CHECK)), *verdicts[4:]]:
        number, statement = claim[0], claim[1]
        out += [f"## Claim {number}: {statement}", "", f"**Verdict: {v}.** {effect}.", "", _per_node(res, claim), "",
                "Final held-out pass@1 (%), mean ± standard error over seeds (n = seeds):", "", *_rows(res, claim), ""]
        path = img / f"replication_claim{number}.png"
        if figure(res, claim, path):
            out += [f"![claim {number}]({os.path.relpath(path, doc.parent)})", ""]
        mech = _mechanism_rows(res, claim[2], [(p, n) for p in claim[3] for n in PAIRS[p]])
        if mech:
            out += ["What explains it (per-step means over rounds and seeds; ratio min/max over all steps):", "",
                    *MECHANISM_HEAD, *mech, ""]
        out += [NOTES[number], ""]
    missing = [f"{p}/{a}/seed {seed}" for p, a in scale.plan for seed in scale.seeds
               if not all(seed in values(res, p, a, n) for n in PAIRS[p])]
    out += ["## Limits of the miniature", "", _LIMITS, "", "## Runs not run yet", "",
            (", ".join(missing) + f". Resume with `python bench/replicate.py` (finished runs are skipped).")
            if missing else "None: every planned run has its result JSON.", "", *real]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(out) + "\n")
    print(f"\n{summary}\nwrote {doc}")


# ---------------------------------------------------------------------------------- the real model
def _same_seed_twice(folder: Path, again: Path) -> list[str]:
    """Table rows: runs repeated at the same seed in a second batch, pass@1 at the first evaluation
    after round 0 in each: the run-to-run spread a seed cannot pin on a GPU (non-deterministic kernels)."""
    first = {(d["arm"], d["seed"]): d for d in (json.loads(p.read_text()) for p in sorted(folder.glob("*-s*.json")))}
    rows, gaps = [], []
    for path in sorted(again.glob("*-s*.json")) if again.is_dir() else []:
        d = json.loads(path.read_text())
        if (d["arm"], d["seed"]) not in first:
            continue
        cells = []
        for a, b in zip(first[(d["arm"], d["seed"])]["nodes"], d["nodes"]):
            x, y = a["curve"][1][1], b["curve"][1][1]
            gaps.append(y - x)
            cells.append(f"{100 * x:.1f} / {100 * y:.1f}")
        rows.append(f"| {d['arm']} | {d['seed']} | " + " | ".join(cells) + " |")
    if len(gaps) < 2:
        return []
    sd = math.sqrt(sum(g * g for g in gaps) / len(gaps) / 2)  # one run's spread: Var(x - y) = 2 Var(run)
    return [f"The same seed run twice (the second batch was cut short by the loan's end, so round 25 only; "
            f"`{os.path.relpath(again, DOC.parent.parent)}`): pass@1 at round 25, first / second run.", "",
            "| arm | seed | " + " | ".join(REAL_PAIRS["smollm2"]) + " |", "|---|---:|---:|---:|", *rows, "",
            f"Mean absolute difference {100 * sum(map(abs, gaps)) / len(gaps):.1f} points, largest "
            f"{100 * max(map(abs, gaps)):.1f}: one run's own spread is about {100 * sd:.1f} points (standard "
            f"deviation), against about 2 points of binomial noise in one 500-problem evaluation "
            f"({len(gaps) // 2} repeated runs). Where two runs of one seed differ, the seed did not pin the run: GPU "
            f"kernels whose floating-point order varies and, in a swarm, which of the peer's rounds arrives in time. "
            f"So a seed-paired difference on the GPU carries the spread of two runs: averaged over the two nodes, "
            f"its 95% interval with 5 seeds is about ± {100 * 2.78 * sd / math.sqrt(5):.0f} points at this "
            f"spread, wider than the 3-point margin.", ""]


def real_section(tiny: dict, img: Path, doc: Path) -> tuple[str, list[str]]:
    """The real-model study (bench/replicate_real.py), claim by claim beside the miniature's numbers:
    (its one-line summary, its lines)."""
    res = {k: v for pair, folder in REAL_FOLDERS.items() for k, v in load_real(folder, REAL_ROUNDS, pair).items()}
    if not res:
        return "not run yet", ["## On a real pretrained model", "",
                               "Not run yet: `python bench/replicate_real.py --device cuda`.", ""]
    verdicts = [(c, *verdict(res, c, REAL_PAIRS)) for c in REAL_CLAIMS]
    count = {v: sum(x[1] == v for x in verdicts) for v in
             ("reproduced", "not reproduced", "inconclusive at this scale", "not run yet")}
    summary = (", ".join(f"{n} {k}" for k, n in count.items() if n) + ": "
               + "; ".join(f"({c[0]}) {v}" for c, v, _ in verdicts))
    first = REAL_FOLDERS["smollm2"]
    study = json.loads((first / "study.json").read_text()) if (first / "study.json").exists() else {}
    per_arm = {a: len({s for (_, b, s) in res if b == a}) for (_, a, _) in res}
    out = ["## On a real pretrained model: SmolLM2-135M-Instruct, full fine-tuning + LoRA r = 128", "",
           _REAL_SETUP.format(rounds=REAL_ROUNDS, seeds="; ".join(f"{a} {n}" for a, n in per_arm.items()),
                              n=next(iter(next(iter(res.values())).values()))["eval_n"],
                              device=study.get("device", "a lent GPU"), date=study.get("date", "?"),
                              warm=REAL_WARM_STEPS, expertise=f"{n} runs" if (n := sum(k[0] == "smollm2-expertise" for k in res)) else
                              "not run yet (`--pair smollm2-expertise`)",
                              minutes=max(json.loads(p.read_text())["seconds"] for p in first.glob("*-s*.json"))
                              / 60),
           "", "| claim | verdict on the real model | the numbers behind it |", "|---|---|---|",
           *[f"| {c[0]} | {v} | {e} |" for c, v, e in verdicts], ""]
    tiny_units = [("trainable", n) for n in PAIRS["trainable"]]
    early = next(iter(next(iter(res.values())).values()))["curve"][1][0]
    for claim, v, effect in verdicts:
        number = claim[0]
        if v == "not run yet":
            out += [f"### Claim {number} (real model): not run yet", "", REAL_NOTES[number], ""]
            continue
        out += [f"### Claim {number} (real model): {claim[1]}", "", f"**Verdict: {v}.** {effect}.", "",
                _per_node(res, claim, REAL_PAIRS), "",
                f"Held-out pass@1 (%) at round {REAL_ROUNDS} ('early': round {early}), mean ± standard error over "
                "seeds:", "",
                *_rows(res, claim, REAL_PAIRS, start="round 0"), ""]
        path = img / f"replication_real_claim{number}.png"
        if figure(res, claim, path, REAL_PAIRS, start="round 0"):
            out += [f"![claim {number}, real model]({os.path.relpath(path, doc.parent)})", ""]
        out += ["Off-policy statistics, real model beside the miniature's trainable pair (full + LoRA, the same "
                "kind of pair): per-step means over rounds and seeds, ratio min/max over all steps.", "",
                *MECHANISM_HEAD, *_mechanism_rows(res, claim[2], [(p, n) for p in REAL_PAIRS for n in REAL_PAIRS[p]]),
                *_mechanism_rows(tiny, claim[2], tiny_units), "", REAL_NOTES[number], ""]
    return summary, out + _same_seed_twice(first, first.parent / "real-cut")


_REAL_SETUP = """Generated from `bench/results/replication/real/` (`bench/replicate_real.py`, run on {device},
{date}; the first run on a lent GPU and the two faults it found: [REPLICATION_REAL.md](REPLICATION_REAL.md)).
The paper's trainable-parameter pair (smollm2): one node fine-tunes every weight of SmolLM2-135M-Instruct
(lr 1e-5), the other trains LoRA r = 128 on q/v (alpha 256, lr 1e-4); no warm start (the instruct
model is prompted with one worked exchange). The expertise pair (smollm2-expertise: two full
fine-tunes, each first given {warm} supervised steps on addition only or on subtraction only, then
RL on both): {expertise}. Task arith, binary reward, G = 12, T = 1, 24 new
tokens; a step of 24 sequences (alone: 2 own groups; swarm: 1 own + 1 peer group, vertical);
C = 2, g = 50; the paper's TIS weights and every peer's negatives (no open-swarm defence), each
node trusting the other; {rounds} rounds; greedy pass@1 on {n} held-out problems at rounds 0, 25 and
{rounds}. Both nodes of a run are threads of one process exchanging packets over `MemoryTransport`
(the libp2p transport's wire format, admission and collect loop, without sockets). Each loan ran
its runs at once on the one card (the longest took {minutes:.1f} min). Paired seeds per arm: {seeds}. Verdict rule and the 3-point margin:
as above, fixed before these runs. Only runs whose nodes both reached round {rounds} count."""

REAL_NOTES = {
    1: "Both nodes start from the same weights and stay close: the peer ratio's mean is 1.00, with a few "
       "tokens per step at the extremes. Even the alone arm's ratios are not exactly 1 (bf16 sampling "
       "against the training forward). With ratios this close, NoIS and F-TIS are nearly the same loss "
       "(the TIS weight min(ratio, 2) is about 1 on almost every token and the filter drops about 1 % of "
       "sequences), and claim 4 shows F-TIS losing to alone too. So what this measures is mostly a cost of "
       "training on a peer's group in place of a second own group, not of a missing off-policy correction; "
       "the recorded statistics do not explain that cost.",
    2: "The filter drops only about 1 % of a step's sequences here (filtered above), so there is little it "
       "can recover, and F-NoIS ends where NoIS does (5 seeds). Not reproduced would need the interval's top "
       "under half of NoIS's loss (2.8 points): about 3 more seeds at this spread, if the mean stays near 0.",
    3: "VIS and TIS differ only on peer tokens whose ratio leaves [1 - eps, 1 + eps]: a small share here. "
       "This pair has one model size, so the paper's 'clearly for the larger model' cannot be tested.",
    4: "The same comparison as claim 1 with the paper's correction on. Out of distribution was not measured "
       "in these runs. Runs from now on evaluate it after round 50 (`task.ood_task`/`ood_options`: sums and "
       "differences of two 2-digit numbers; training's second operand has 1 digit), a set where the instruct "
       "model is well above its floor: greedy pass@1 before RL 20.6 % on it against 28.8 % in distribution "
       "(500 problems each, fp32 on the 2-core EPYC).",
    5: "Ran on the third loan (5 seeds, horizontal as the paper defines it) and found a fault instead of a "
       "result: none of the 5 runs reached round 25 in the 515 s every vertical run needed under 400 s for. "
       "In horizontal mode both nodes answer the same prompts, and two confident models often write the same "
       "share of a group; admission refused such a packet as an echo of our own group, so the round waited "
       "the full 120 s deadline. Now a share equal to ours is dropped from the packet, not refused "
       "(swarm/admit.py; tests/test_node.py runs two nodes whose shares are always equal). The runs are "
       "planned for the next loan (`python bench/replicate_real.py --device cuda --arms horizontal`).",
    6: "A smaller g filters more of a peer's negatives: about 5 % of a step's sequences at g = 5, 2 % at 10, "
       "1 % at 50 and under 0.5 % at 100 (filtered above). The means fall as g grows, on both nodes (g = 5: 64-65 %, 100: 60 %), but no g moved "
       "pass@1 by a resolvable amount: g = 5 "
       "(5 seeds) ended 2.4 points above g = 50, its interval -3.4 .. +8.1; g = 10 and 100 ran 3 seeds, "
       "whose intervals (t = 4.3) span some 45 points at this run-to-run spread.",
}


_LIMITS = """- The models are tiny character-level transformers (tiny-s 0.11 M parameters) taught the answer
  format by a supervised warm start, not pretrained LLMs: the "size" gap and the off-policy gap
  between two nodes are much smaller than between Qwen2.5-1.5B and 3B.
- One optimizer step per round (as in the paper's setting), so R = pi_theta / pi_old is 1 in value
  and only the peer ratio pi_theta / pi_gen separates NoIS, VIS and TIS.
- Held-out noise: one evaluation on 500 problems has a binomial standard error of about 2 points
  at 30 % accuracy; with 3 seeds a paired difference needs to be several points to be resolved.
- The OOD set is hard for these models (a few % at most), so an OOD difference sits near the floor.
- Expertise is mimicked by warm starts on disjoint operations (the warm start is done by this
  script and passed as the node's model path), not by different pretraining corpora."""


_SETUP = """Setup: two heterogeneous nodes per swarm, each a real `swarm-node join` process on
127.0.0.1 (alone: `swarm-node train`): **size** = tiny-s + tiny-m, **trainable** = tiny-s full +
tiny-s LoRA r=8, **expertise** = two tiny-s warm-started (800 supervised steps) on addition only and
on subtraction only, both then RL-trained on both. Task: arith, 2-digit first operand, 1-digit second
("What is 48 plus 7?"). The paper's batch: G = 12, 1 prompt per round, 1 own + 1 peer group per step
(`swarm.peer_groups_per_own=1`), C = 2, g = 50 unless varied, vertical unless horizontal; alone =
plain GRPO on 2 own groups per step (the same 24 sequences and the same number of steps, as the
paper's baseline; its first prompt each round is the swarm node's prompt). {rounds} rounds, held-out
greedy pass@1 on {n} test problems at the start, every {eval_every} rounds and at the end; OOD:
{ood} problems with a second operand of 10..99. Seeds: {seeds} (the same seeds in every arm that ran them, so differences
are paired per seed). Warm
starts' OOD pass@1: {warm}. Wall time of the runs below: {minutes:.0f} min.

Verdict rule (per claim, on the seed-paired difference averaged over the claim's nodes, 95% t
interval): a "worse" claim is reproduced if the interval is below 0 and not reproduced if it rules
out a loss of {delta:.0f} points or more; a "not worse" claim is reproduced if it rules out a loss of
{delta:.0f} points; otherwise inconclusive at this scale."""

"""Statistics, verdicts and the report of the replication study (docs/REPLICATION.md).

bench/replicate.py runs the arms of the study (bench/replicate_study.py) and then calls `render`
here; `python bench/replicate.py --render` only redraws the document from the cached per-run JSON.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from bench.replicate_study import DOC, IMG, PAIRS, RUNS, Scale

# ---------------------------------------------------------------------------------- statistics
DELTA = 0.03  # smallest effect we care about: 3 points of pass@1 (one 500-problem eval is +-2)
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def mean_se(values: list[float]) -> tuple[float, float, int]:
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else math.nan
    return mean, se, n


def ci95(values: list[float]) -> tuple[float, float]:
    mean, se, n = mean_se(values)
    half = T95.get(n - 1, 2.0) * se if n > 1 else math.inf
    return mean - half, mean + half


def pct(mean: float, se: float = math.nan, n: int | None = None, signed: bool = False) -> str:
    if n == 0 or math.isnan(mean):
        return "not run yet"
    text = f"{100 * mean:+.1f}" if signed else f"{100 * mean:.1f}"
    return text + (f" ± {100 * se:.1f}" if not math.isnan(se) else "") + (f" (n={n})" if n is not None else "")


# ---------------------------------------------------------------------------------- results
def load(scale: Scale) -> dict:
    """{(pair, arm, seed): {node: record}} of every result JSON (alone runs looked up per node)."""
    found: dict = {}
    for path in sorted(scale.results.glob("*.json")):
        if path.name == "warm-ood.json":
            continue
        data = json.loads(path.read_text())
        for rec in data["nodes"]:
            alone = data["arm"] == "alone"  # an alone run counts for every pair its node is in
            pairs = [p for p, names in PAIRS.items() if rec["node"] in names] if alone else [data["pair"]]
            for pair in pairs:
                found.setdefault((pair, data["arm"], data["seed"]), {})[rec["node"]] = rec
    return found


def values(res: dict, pair: str, arm: str, node: str, key: str = "final") -> dict[int, float]:
    return {seed: recs[node][key] for (p, a, seed), recs in res.items() if p == pair and a == arm and node in recs}


def diffs(res: dict, units: list[tuple[str, str]], arm: str, base: str, key: str = "final") -> list[float]:
    """Per seed: the mean over `units` (pair, node) of arm - base; only seeds where all are present."""
    per = [(values(res, p, arm, n, key), values(res, p, base, n, key)) for p, n in units]
    seeds = set.intersection(*[set(a) & set(b) for a, b in per]) if per else set()
    return [sum(a[s] - b[s] for a, b in per) / len(per) for s in sorted(seeds)]


def mechanism(res: dict, pair: str, arm: str, node: str) -> dict[str, float]:
    """Per-step means over rounds and seeds of what explains a result (the loss's own metrics)."""
    rows = [r for (p, a, _), recs in res.items() if p == pair and a == arm and node in recs
            for r in recs[node]["rows"] if r.get("round", 0) > 0]
    out = {}
    for key, how in (("filter/dropped_frac", "mean"), ("is/truncated_frac", "mean"), ("is/ratio_mean", "mean"),
                     ("is/ratio_min", "min"), ("is/ratio_max", "max"), ("swarm/peer_groups_used", "mean")):
        vals = [r[key] for r in rows if key in r]
        summary = {"min": min, "max": max, "mean": lambda v: sum(v) / len(v)}[how]
        out[key] = summary(vals) if vals else math.nan
    return out


# ---------------------------------------------------------------------------------- claims
CLAIMS = [  # (number, statement, arms shown (first = baseline), pairs, test, (arm, base) of the effect)
    (1, "NoIS (peers' samples treated as on-policy) makes both nodes worse than training alone.",
     ["alone", "nois"], list(PAIRS), "lower", ("nois", "alone")),
    (2, "Filtering alone (F-NoIS) recovers most of that loss.", ["alone", "nois", "f-nois"], list(PAIRS),
     "recover", ("f-nois", "nois")),
    (3, "TIS beats VIS, clearly for the larger model (here F-TIS vs F-VIS, size pair; larger = tiny-m).",
     ["f-vis", "f-tis"], ["size"], "higher-large", ("f-tis", "f-vis")),
    (4, "F-TIS reaches the same final accuracy as training alone, and sometimes better out of distribution.",
     ["alone", "f-tis"], list(PAIRS), "not-worse", ("f-tis", "alone")),
    (5, "Horizontal collaboration is worse than vertical (F-TIS, size pair).", ["f-tis", "horizontal"], ["size"],
     "lower", ("horizontal", "f-tis")),
    (6, "The filter threshold g matters (F-TIS, size pair, g = 5, 10, 50, 100).", ["g5", "g10", "f-tis", "g100"],
     ["size"], "g", ("g5", "f-tis")),
]


# not a claim of the paper: the same test as claim 4 with the project's open-swarm defaults (issue 26)
OPEN_CHECK = ("4-open", "The same with the open-swarm defences on (peers' negatives dropped, the plausibility "
              "check, sign-aware TIS weights: the project's defaults): F-TIS still reaches the same final "
              "accuracy as training alone.", ["alone", "f-tis", "f-tis-open"], list(PAIRS), "not-worse",
              ("f-tis-open", "alone"))


def verdict(res: dict, claim) -> tuple[str, str]:
    """(reproduced | not reproduced | inconclusive at this scale | not run yet, the numbers behind it)."""
    number, _, arms, pairs, test, (arm, base) = claim
    units = [(p, n) for p in pairs for n in PAIRS[p] if len(diffs(res, [(p, n)], arm, base)) >= 2]
    units = [u for u in units if all(len(diffs(res, [v], arm, base)) >= 2 for v in units if v[0] == u[0])]
    d = diffs(res, units, arm, base)
    if len(d) < 2:
        return ("not run yet" if not d else "inconclusive at this scale"), f"{len(d)} paired seed(s) of {arm} vs {base}"
    (m, se, n), (lo, hi) = mean_se(d), ci95(d)
    run = sorted({p for p, _ in units}, key=list(PAIRS).index)
    effect = (f"{arm} − {base}: {100 * m:+.1f} ± {100 * se:.1f} points (95% CI {100 * lo:+.1f} .. {100 * hi:+.1f}, "
              f"{n} seeds, mean over the nodes of {', '.join(run)}"
              + (f"; {', '.join(p for p in pairs if p not in run)} not run yet)" if len(run) < len(pairs) else ")"))
    if test == "lower":
        return ("reproduced" if hi < 0 else "not reproduced" if lo > -DELTA else "inconclusive at this scale"), effect
    if test == "not-worse":
        od = diffs(res, units, arm, base, "ood")
        if len(od) >= 2:
            per_node = [diffs(res, [u], arm, base, "ood") for u in units]
            better = sum(ci95(d)[0] > 0 and mean_se(d)[0] >= 0.01 for d in per_node)  # >= 5 problems: near the floor
            effect += (f"; out of distribution: {100 * mean_se(od)[0]:+.1f} ± {100 * mean_se(od)[1]:.1f} points "
                       f"(CI {100 * ci95(od)[0]:+.1f} .. {100 * ci95(od)[1]:+.1f}), "
                       f"better by >= 1 point with CI above 0 on "
                       f"{better} of {len(units)} nodes")
        return ("reproduced" if lo > -DELTA else "not reproduced" if hi < 0 else "inconclusive at this scale"), effect
    if test == "higher-large":
        dl = diffs(res, [("size", "tiny-m")], arm, base)
        (ml, sel, _), (lol, hil) = mean_se(dl), ci95(dl)
        effect += f"; tiny-m alone: {100 * ml:+.1f} ± {100 * sel:.1f} (CI {100 * lol:+.1f} .. {100 * hil:+.1f})"
        return ("reproduced" if lol > 0 else "not reproduced" if hil < DELTA else "inconclusive at this scale"), effect
    if test == "recover":
        harm = diffs(res, units, "nois", "alone")
        if len(harm) < 2 or ci95(harm)[1] >= 0:
            return ("inconclusive at this scale",
                    effect + "; NoIS did no measurable harm here, so there is nothing to recover")
        share = m / -mean_se(harm)[0]
        effect += f"; recovers {100 * share:.0f}% of NoIS's loss"
        return ("reproduced" if lo > 0 and share >= 0.5 else "not reproduced" if hi < -0.5 * mean_se(harm)[0]
                else "inconclusive at this scale"), effect
    parts, outside, inside = [], False, True  # test == "g": any g differs from g = 50?
    for g_arm in ("g5", "g10", "g100"):
        dg = diffs(res, units, g_arm, "f-tis")
        if len(dg) < 2:
            return "not run yet", f"{len(dg)} paired seed(s) of {g_arm} vs g = 50"
        (mg, seg, _), (lo, hi) = mean_se(dg), ci95(dg)
        outside |= lo > 0 or hi < 0
        inside &= lo > -DELTA and hi < DELTA
        parts.append(f"{g_arm} − g50: {100 * mg:+.1f} ± {100 * seg:.1f} (CI {100 * lo:+.1f} .. {100 * hi:+.1f})")
    return ("reproduced" if outside else "not reproduced" if inside else "inconclusive at this scale"), "; ".join(parts)



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
    5: "Horizontal: both nodes answer the same prompt each round and their groups merge into one group of "
       "24 completions from two policies (advantages mix both nodes' rewards); vertical: each node answers "
       "its own prompt and trains on 1 own + 1 peer group.",
    "4-open": "Not one of the paper's claims: the check that the project's defences against poisoning peers "
              "(issue 26) leave honest collaboration intact. f-tis-open is the f-tis arm with loss.C_negative, "
              "loss.positive_floor, loss.peer_negative_weight and loss.peer_plausibility_margin at their "
              "defaults instead of the paper's values; everything else is the same.",
    6: "g only acts on negative-advantage peer sequences; the dropped fraction per g shows how many it "
       "removes. A smaller g drops more, but too few sequences change for accuracy to move measurably here.",
}


SUFFIX = {"final": "", "early": " early", "ood": " OOD"}
YLABEL = {"final": "final held-out", "early": "early (1st eval) held-out", "ood": "final OOD"}


def _per_node(res: dict, claim) -> str:
    """One line: each node's seed-paired difference of the claim's effect with its 95% interval."""
    _, _, _, pairs, _, (arm, base) = claim
    parts = []
    for p in pairs:
        for n in PAIRS[p]:
            d = diffs(res, [(p, n)], arm, base)
            if len(d) >= 2:
                lo, hi = ci95(d)
                parts.append(f"{p}/{n} {100 * mean_se(d)[0]:+.1f} ({100 * lo:+.1f} .. {100 * hi:+.1f})")
    return f"Per node, {arm} − {base} (points, 95% CI): " + ("; ".join(parts) or "not run yet") + "."


def _rows(res: dict, claim) -> list[str]:
    number, _, arms, pairs, _, (_, base) = claim
    keys = ["early", "final", "ood"] if number == 4 else ["final"]
    head = ["pair", "node", "warm start"] + [f"{a}{SUFFIX[k]}" for k in keys for a in arms]
    head += [f"{a} − {base}{SUFFIX[k]} (paired)" for k in keys for a in arms if a != base]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for pair in pairs:
        for node in PAIRS[pair]:
            starts = [v for a in arms for v in values(res, pair, a, node, "start").values()]
            cells = [pair, node, pct(starts[0]) if starts else "not run yet"]
            cells += [pct(*mean_se(list(values(res, pair, a, node, k).values()))) for k in keys for a in arms]
            cells += [pct(*mean_se(diffs(res, [(pair, node)], a, base, k)), signed=True)
                      for k in keys for a in arms if a != base]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _mechanism_rows(res: dict, claim) -> list[str]:
    _, _, arms, pairs, _, _ = claim
    lines = ["| pair | node | arm | filtered | truncated | ratio mean | ratio min | ratio max | peer groups/step |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for pair in pairs:
        for node in PAIRS[pair]:
            for arm in arms:
                m = mechanism(res, pair, arm, node)
                if all(math.isnan(v) for v in m.values()):
                    continue
                f = [f"{m[k]:.3f}" if not math.isnan(m[k]) else "–" for k in m]
                lines.append(f"| {pair} | {node} | {arm} | " + " | ".join(f) + " |")
    return lines


def figure(res: dict, claim, path: Path) -> bool:
    """Bars (mean +- SE, seeds as dots) of final held-out accuracy per node and arm; False if no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    number, _, arms, pairs, _, _ = claim
    units = [(p, n) for p in pairs for n in PAIRS[p]]
    keys = ["early", "final", "ood"] if number == 4 else ["final"]
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
                          label="warm start" if i == 0 else None)
        ax.set_xticks(range(len(units)), [f"{p}\n{n}" for p, n in units], fontsize=8)
        ax.set_ylabel(f"{YLABEL[key]} pass@1 (%)")
        ax.legend(fontsize=8)
    fig.suptitle(f"Claim {number}: {claim[1][:90]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(scale: Scale, quick: bool) -> None:
    res = load(scale)
    doc, img = (RUNS / "quick" / "REPLICATION.md", RUNS / "quick") if quick else (DOC, IMG)
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
    out = ["# The paper's claims, re-tested in miniature", "", f"**Summary:** {summary}", "",
           "Generated by `python bench/replicate.py` from the JSON in `bench/results/replication/` "
           "(`--render` redraws without running anything). " + _SETUP.format(
               rounds=scale.rounds, eval_every=scale.eval_every or scale.rounds, n=scale.eval_limit,
               ood=scale.ood_limit, seeds=", ".join(map(str, seeds)) or "none yet", minutes=minutes,
               delta=100 * DELTA, warm=", ".join(f"{k} {100 * v:.1f}%" for k, v in warm.items())), "",
           "On a real pretrained model (SmolLM2-135M-Instruct, full fine-tuning + LoRA r = 128, on a lent GPU): "
           "[REPLICATION_REAL.md](REPLICATION_REAL.md), `bench/replicate_real.py`.", ""]
    for claim, v, effect in [*verdicts[:4], (OPEN_CHECK, *verdict(res, OPEN_CHECK)), *verdicts[4:]]:
        number, statement = claim[0], claim[1]
        out += [f"## Claim {number}: {statement}", "", f"**Verdict: {v}.** {effect}.", "", _per_node(res, claim), "",
                "Final held-out pass@1 (%), mean ± standard error over seeds (n = seeds):", "", *_rows(res, claim), ""]
        path = img / f"replication_claim{number}.png"
        if figure(res, claim, path):
            out += [f"![claim {number}]({os.path.relpath(path, doc.parent)})", ""]
        mech = _mechanism_rows(res, claim)
        if len(mech) > 2:
            out += ["What explains it (per-step means over rounds and seeds; ratio min/max over all steps):", "",
                    *mech, ""]
        out += [NOTES[number], ""]
    missing = [f"{p}/{a}/seed {seed}" for p, a in scale.plan for seed in scale.seeds
               if not all(seed in values(res, p, a, n) for n in PAIRS[p])]
    out += ["## Limits of the miniature", "", _LIMITS, "", "## Runs not run yet", "",
            (", ".join(missing) + f". Resume with `python bench/replicate.py` (finished runs are skipped).")
            if missing else "None: every planned run has its result JSON.", ""]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(out) + "\n")
    print(f"\n{summary}\nwrote {doc}")


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

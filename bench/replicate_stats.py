"""Statistics and verdicts of the replication study: seed-paired differences, 95% t intervals, and
the pre-registered rule that turns them into "reproduced", "not reproduced" or "inconclusive".

Shared by the miniature study (bench/replicate.py) and the real-model study (bench/replicate_real.py);
bench/replicate_report.py renders both into docs/REPLICATION.md.
"""

from __future__ import annotations

import json
import math

from pathlib import Path

from bench.replicate_study import PAIRS, REAL_PAIRS, Scale

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


def load_real(folder: Path, rounds: int, pair: str) -> dict:
    """The real-model study's runs of `pair` in load()'s shape, {(pair, arm, seed): {node: record}}; only
    runs whose every node reached round `rounds` ("final" is that evaluation, "early" the first after 0)."""
    names, found = REAL_PAIRS[pair], {}
    for path in sorted(folder.glob("*-s*.json")):
        data = json.loads(path.read_text())
        if all(n["final_round"] == rounds for n in data["nodes"]) and [n["node"] for n in data["nodes"]] == list(names):
            found[(pair, data["arm"], data["seed"])] = {
                n["node"]: {**n, "early": n["curve"][min(1, len(n["curve"]) - 1)][1]} for n in data["nodes"]}
    return found


def values(res: dict, pair: str, arm: str, node: str, key: str = "final") -> dict[int, float]:
    return {seed: recs[node][key] for (p, a, seed), recs in res.items()
            if p == pair and a == arm and key in recs.get(node, {})}


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


# the same claims on the real pair (full fine-tuning + LoRA, one model size: claim 3 on the mean of both nodes)
REAL_CLAIMS = [(n, "TIS beats VIS (here F-TIS vs F-VIS, mean of the two nodes: no two sizes of one tokenizer are "
                   "installable here)." if n == 3 else statement, arms, list(REAL_PAIRS),
                "higher" if n == 3 else test, effect) for n, statement, arms, _, test, effect in CLAIMS]


# not a claim of the paper: the same test as claim 4 with the project's open-swarm defaults (issue 26)
OPEN_CHECK = ("4-open", "The same with the open-swarm defences on (peers' negatives dropped, the plausibility "
              "check, sign-aware TIS weights: the project's defaults): F-TIS still reaches the same final "
              "accuracy as training alone.", ["alone", "f-tis", "f-tis-open"], list(PAIRS), "not-worse",
              ("f-tis-open", "alone"))


def verdict(res: dict, claim, nodes: dict = PAIRS) -> tuple[str, str]:
    """(reproduced | not reproduced | inconclusive at this scale | not run yet, the numbers behind it);
    `nodes`: pair -> its node names (the miniature's PAIRS, or REAL_PAIRS)."""
    number, _, arms, pairs, test, (arm, base) = claim
    units = [(p, n) for p in pairs for n in nodes[p] if len(diffs(res, [(p, n)], arm, base)) >= 2]
    units = [u for u in units if all(len(diffs(res, [v], arm, base)) >= 2 for v in units if v[0] == u[0])]
    d = diffs(res, units, arm, base)
    if len(d) < 2:
        return ("not run yet" if not d else "inconclusive at this scale"), f"{len(d)} paired seed(s) of {arm} vs {base}"
    (m, se, n), (lo, hi) = mean_se(d), ci95(d)
    run = sorted({p for p, _ in units}, key=list(nodes).index)
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
    if test == "higher":
        return ("reproduced" if lo > 0 else "not reproduced" if hi < DELTA else "inconclusive at this scale"), effect
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

"""Figures from any runs' metrics.jsonl files (demo, join, train): the paper's validation curves.

    accuracy.png   held-out greedy pass@1 vs round, one line per node (linestyle per run kind),
                   with a +-1 standard-error band (the eval set is finite: small gaps are noise)
    training.png   reward/mean and filter/dropped_frac vs round (smoothed; raw values faint)
    compare.png    one panel per node: held-out accuracy of each run kind (swarm F-TIS vs
                   swarm NoIS vs alone), as drawn by `swarm-node demo --compare`

A run directory is any directory holding metrics.jsonl files: a node's --out directory
itself, a demo's runs/<timestamp>/ (one sub-directory per node), or a --compare run
(runs/<timestamp>/<kind>/<node>/). `load_runs` finds them all; `swarm-node plot` draws them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from swarm_node.errors import SwarmNodeError
from swarm_node.metrics import EVAL_ACCURACY, EVAL_N, NODE, REWARD_MEAN, ROUND, read_metrics

# Metric keys this module reads from metrics.jsonl (the loss's own keys live in swarm_node/train/loss.py,
# STAT_KEYS, which imports torch: named here so drawing plots never loads it).
DROPPED_FRAC = "filter/dropped_frac"
METRIC_KEYS = (ROUND, NODE, EVAL_ACCURACY, EVAL_N, REWARD_MEAN, DROPPED_FRAC)

KIND_STYLES = ["-", "--", ":", "-."]
KIND_LABELS = {"swarm-f-tis": "swarm, F-TIS", "swarm-nois": "swarm, NoIS", "alone": "alone"}
# Colour-blind-friendly (Okabe-Ito) palette, one colour per node name.
COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]


class NoRunsError(SwarmNodeError, FileNotFoundError):
    """A run directory to plot does not exist or holds no metrics.jsonl."""


@dataclass
class Series:
    """One node's metrics in one run."""

    node: str
    kind: str  # run kind/label ("" for a plain run); decides the linestyle
    path: Path  # the node's output directory
    rows: list[dict] = field(default_factory=list)
    description: str = ""  # e.g. "tiny-m, full" (from the node's config.yaml)

    def points(self, key: str) -> tuple[list[int], list[float]]:
        """(rounds, values) of rows that have `key` (a round's last row wins, e.g. after a resume)."""
        by_round = {}
        for row in self.rows:
            if row.get(key) is not None and ROUND in row:
                by_round[int(row[ROUND])] = float(row[key])
        rounds = sorted(by_round)
        return rounds, [by_round[r] for r in rounds]

    def eval_n(self) -> int:
        return max((int(r[EVAL_N]) for r in self.rows if r.get(EVAL_N)), default=0)


def describe(node_dir: Path) -> str:
    """Short description of a node from its resolved config: 'tiny-s, LoRA r=8' / 'Qwen2.5-3B, full'."""
    try:
        cfg = yaml.safe_load((node_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return ""
    model = cfg.get("model") or {}
    name = Path(str(model.get("name", "?")).rstrip("/")).name
    r = int(model.get("lora_r") or 0)
    return f"{name}, LoRA r={r}" if r else f"{name}, full"


def _node_dirs(root: Path) -> list[Path]:
    if (root / "metrics.jsonl").is_file():
        return [root]
    return sorted(p.parent for p in root.rglob("metrics.jsonl") if len(p.relative_to(root).parts) <= 4)


def load_runs(run_dirs: list[str | Path]) -> list[Series]:
    """Every node series under the given run directories (raises NoRunsError if one has none)."""
    series: list[Series] = []
    several = len(run_dirs) > 1
    for run_dir in map(Path, run_dirs):
        if not run_dir.is_dir():
            raise NoRunsError(f"{run_dir} is not a directory")
        dirs = _node_dirs(run_dir)
        if not dirs:
            raise NoRunsError(f"no metrics.jsonl under {run_dir}")
        for node_dir in dirs:
            rows = read_metrics(node_dir / "metrics.jsonl")
            node = next((str(r[NODE]) for r in rows if r.get(NODE)), node_dir.name)
            rel = node_dir.relative_to(run_dir).parts[:-1] if node_dir != run_dir else ()
            kind = "/".join(rel)
            if several:
                kind = f"{run_dir.resolve().name}/{kind}" if kind else run_dir.resolve().name
            series.append(Series(node=node, kind=kind, path=node_dir, rows=rows, description=describe(node_dir)))
        nodes, kinds = _demo_order(run_dir)
        if nodes:  # a demo run: keep its node and run-kind order (and so its colours and line styles)
            def rank(s: Series) -> tuple[int, int]:
                kind = s.kind.rsplit("/", 1)[-1]
                return (kinds.index(kind) if kind in kinds else len(kinds),
                        nodes.index(s.node) if s.node in nodes else len(nodes))

            start = len(series) - len(dirs)
            series[start:] = sorted(series[start:], key=rank)
    return series


def _demo_order(run_dir: Path) -> tuple[list[str], list[str]]:
    """(node names, run kinds) in the order `swarm-node demo` ran them (from its demo.json)."""
    try:
        info = json.loads((run_dir / "demo.json").read_text())
        return [str(n) for n in info.get("nodes", [])], [str(k) for k in info.get("kinds", [])]
    except (OSError, ValueError, AttributeError):
        return [], []


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "grid.alpha": 0.3, "font.size": 10, "legend.frameon": False})
    return plt


def _styles(series: list[Series]) -> tuple[dict[str, str], dict[str, str]]:
    nodes = list(dict.fromkeys(s.node for s in series))
    kinds = list(dict.fromkeys(s.kind for s in series))
    return ({n: COLORS[i % len(COLORS)] for i, n in enumerate(nodes)},
            {k: KIND_STYLES[i % len(KIND_STYLES)] for i, k in enumerate(kinds)})


def _label(s: Series, with_kind: bool) -> str:
    """'tiny-s (full)', 'tiny-s-lora (tiny-s, LoRA r=8)', plus ' - swarm, NoIS' when kinds differ."""
    label = s.node
    if s.description:
        model, _, trainable = s.description.partition(", ")
        label += f" ({trainable})" if model == s.node else f" ({s.description})"
    if with_kind and s.kind:
        label += f" - {KIND_LABELS.get(s.kind, s.kind)}"
    return label


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (shorter at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _window(n: int) -> int:
    return max(1, min(10, n // 8))


def plot_accuracy(series: list[Series], path: str | Path, title: str | None = None) -> Path:
    """Held-out accuracy vs round, one line per node (and linestyle per run kind)."""
    plt = _plt()
    colors, styles = _styles(series)
    with_kind = len(styles) > 1
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for s in series:
        rounds, acc = s.points(EVAL_ACCURACY)
        if not rounds:
            continue
        pct = [100 * a for a in acc]
        ax.plot(rounds, pct, styles[s.kind], color=colors[s.node], marker="o", markersize=3.5, linewidth=1.8,
                label=_label(s, with_kind))
        n = s.eval_n()
        if n and not with_kind:
            se = [100 * math.sqrt(max(a * (1 - a), 1e-12) / n) for a in acc]
            ax.fill_between(rounds, [p - e for p, e in zip(pct, se)], [p + e for p, e in zip(pct, se)],
                            color=colors[s.node], alpha=0.12, linewidth=0)
        if rounds[0] == 0:
            ax.plot([0], [pct[0]], marker="s", color=colors[s.node], markersize=6, linestyle="none")
    n = max((s.eval_n() for s in series), default=0)
    ax.set_xlabel("round (0 = warm start, before RL)")
    ax.set_ylabel("held-out accuracy, greedy pass@1 (%)")
    ax.set_title(title or "Held-out accuracy per node" + (f"  (n = {n} problems, band = ±1 s.e.)" if n and not with_kind else ""))
    ax.legend(loc="lower right" if not with_kind else "best", fontsize=9)
    return _save(fig, path)


def plot_training(series: list[Series], path: str | Path, title: str | None = None) -> Path:
    """Two panels: reward/mean and filter/dropped_frac vs round (moving average, raw values faint)."""
    plt = _plt()
    colors, styles = _styles(series)
    with_kind = len(styles) > 1
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    panels = ((REWARD_MEAN, "mean reward of own sampled completions", "Reward (fraction of own samples correct)"),
              (DROPPED_FRAC, "fraction of sequences dropped",
               "F-TIS filter: dropped sequences (A ≤ 0 and KL ≥ g)"))
    handles: dict[str, object] = {}
    for ax, (key, ylabel, panel_title) in zip(axes, panels):
        drew = False
        for s in series:
            rounds, values = s.points(key)
            if not rounds:
                continue
            drew = True
            ax.plot(rounds, values, styles[s.kind], color=colors[s.node], alpha=0.18, linewidth=0.9)
            (line,) = ax.plot(rounds, smooth(values, _window(len(values))), styles[s.kind], color=colors[s.node],
                              linewidth=1.9)
            handles.setdefault(_label(s, with_kind), line)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.set_title(panel_title)
        ax.set_ylim(bottom=0)
        if not drew:
            ax.text(0.5, 0.5, f"no {key} in these runs", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title or "Training signals (thick: moving average, faint: every round)", fontsize=11)
    # one legend below both panels; with several run kinds, one column per kind (legends fill by column)
    ncol = max(1, len({s.kind for s in series}) if with_kind else min(len(handles), 4))
    fig.tight_layout(rect=(0, 0.02 + 0.05 * -(-len(handles) // ncol), 1, 1))
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=9)
    return _save(fig, path, tight=False)


def plot_compare(series: list[Series], path: str | Path, title: str | None = None) -> Path:
    """One panel per node: held-out accuracy of each run kind (e.g. swarm F-TIS vs swarm NoIS vs alone)."""
    plt = _plt()
    nodes = list(dict.fromkeys(s.node for s in series))
    kinds = list(dict.fromkeys(s.kind for s in series))
    kind_colors = {k: COLORS[i % len(COLORS)] for i, k in enumerate(kinds)}
    fig, axes = plt.subplots(1, len(nodes), figsize=(4.6 * len(nodes), 4.2), sharey=True, squeeze=False)
    for ax, node in zip(axes[0], nodes):
        for s in (s for s in series if s.node == node):
            rounds, acc = s.points(EVAL_ACCURACY)
            if rounds:
                ax.plot(rounds, [100 * a for a in acc], KIND_STYLES[kinds.index(s.kind) % len(KIND_STYLES)],
                        color=kind_colors[s.kind], marker="o", markersize=3, linewidth=1.8,
                        label=KIND_LABELS.get(s.kind, s.kind or "run"))
        desc = next((s.description for s in series if s.node == node and s.description), "")
        ax.set_title(f"{node}" + (f"\n({desc})" if desc and desc.split(",")[0] != node else ""), fontsize=10)
        ax.set_xlabel("round")
        ax.legend(loc="best", fontsize=8)
    axes[0][0].set_ylabel("held-out accuracy (%)")
    fig.suptitle(title or "Same nodes, same seeds: swarm with F-TIS vs swarm with NoIS vs alone", fontsize=11)
    return _save(fig, path)


def _save(fig, path: str | Path, tight: bool = True) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if tight:
        fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_runs(run_dirs: list[str | Path], out: str | Path | None = None) -> list[Path]:
    """Draw accuracy.png and training.png (and compare.png when there are several run kinds) for
    the given run directories into `out` (default: the run directory when there is one, else '.')."""
    series = load_runs(run_dirs)
    out = Path(out) if out is not None else (Path(run_dirs[0]) if len(run_dirs) == 1 else Path("."))
    paths = [plot_accuracy(series, out / "accuracy.png"), plot_training(series, out / "training.png")]
    if len({s.kind for s in series}) > 1:
        paths.append(plot_compare(series, out / "compare.png"))
    return paths


def accuracy_table(series: list[Series]) -> list[dict]:
    """Per node series: start (round 0) and end (last eval) held-out accuracy, for summary tables."""
    table = []
    for s in series:
        rounds, acc = s.points(EVAL_ACCURACY)
        if not rounds:
            continue
        table.append({"node": s.node, "kind": s.kind, "model": s.description, "start": acc[0], "end": acc[-1],
                      "best": max(acc), "rounds": rounds[-1], "n": s.eval_n()})
    return table

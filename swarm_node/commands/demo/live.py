"""The demo's terminal side: a live table of the nodes, and the end-of-demo summary table.

The live table only *reads*: the node processes write OUT/metrics.jsonl (one JSON row per
round) and OUT/status.json (swarm_node/status.py: state, model size, ...), and `NodeView` tails
them. On a terminal the table redraws in place (rich.Live); elsewhere (CI logs, pipes) the same
information is printed as plain lines, one per held-out evaluation and one per node that finishes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.progress import ProgressBar
from rich.table import Table
from rich.text import Text

from swarm_node.metrics import EVAL_ACCURACY, PEER_GROUPS_USED, PEERS, REWARD_MEAN, ROUND, TIME_ROUND
from swarm_node.status import read_status

# Metric keys this module reads from metrics.jsonl (the loss's own keys live in swarm_node/train/loss.py,
# STAT_KEYS, which imports torch: named here so the demo process never loads it).
DROPPED_FRAC, TRUNCATED_FRAC = "filter/dropped_frac", "is/truncated_frac"
METRIC_KEYS = (ROUND, EVAL_ACCURACY, REWARD_MEAN, PEERS, PEER_GROUPS_USED, DROPPED_FRAC, TRUNCATED_FRAC, TIME_ROUND)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _frac(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


@dataclass
class NodeView:
    """What the live table knows about one node, from tailing its metrics.jsonl and status.json."""

    name: str
    kind: str
    out: Path
    rounds: int
    model: str = ""
    params: str = ""
    status: str = "waiting"  # waiting | starting | running | done | failed | stopped
    rows: list[dict] = field(default_factory=list)
    acc: list[tuple[int, float]] = field(default_factory=list)  # (round, accuracy)
    _offset: int = 0
    _partial: str = ""

    def poll(self) -> list[dict]:
        """Read metrics rows appended since the last call; returns them."""
        path = self.out / "metrics.jsonl"
        if not self.params:
            self._read_params()
        try:
            with path.open() as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return []
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        new = []
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            new.append(row)
            self.rows.append(row)
            if row.get(EVAL_ACCURACY) is not None:
                self.acc.append((int(row.get(ROUND, 0)), float(row[EVAL_ACCURACY])))
        if new and self.status in ("waiting", "starting"):
            self.status = "running"
        return new

    def _read_params(self) -> None:
        params = (read_status(self.out) or {}).get("params")
        if params is not None:
            self.params = f"{params / 1e6:.2f}M params"

    # ---- derived values ----------------------------------------------------------------------
    @property
    def round(self) -> int:
        return max((int(r[ROUND]) for r in self.rows if ROUND in r), default=-1)

    def last(self, key: str, window: int = 1) -> float | None:
        values = [r[key] for r in self.rows if r.get(key) is not None][-window:]
        return sum(values) / len(values) if values else None

    @property
    def start_acc(self) -> float | None:
        return next((a for r, a in self.acc if r == 0), None)

    @property
    def end_acc(self) -> float | None:
        return self.acc[-1][1] if self.acc else None


def node_table(views: list[NodeView], title: str, caption: str = "") -> Table:
    """One row per node: progress, reward, held-out accuracy, peers, peer groups, filter, truncation."""
    table = Table(title=title, caption=caption, title_style="bold", caption_style="dim", expand=False)
    table.add_column("node", style="bold")
    table.add_column("model")
    table.add_column("round", justify="right")
    table.add_column("", min_width=12)
    table.add_column("reward\n(last 10)", justify="right")
    table.add_column("held-out acc\nstart → now", justify="right")
    table.add_column("peers", justify="right")
    table.add_column("peer\ngroups", justify="right")
    table.add_column("filtered", justify="right")
    table.add_column("truncated", justify="right")
    table.add_column("s/round", justify="right")
    table.add_column("status")
    styles = {"done": "green", "failed": "bold red", "stopped": "yellow", "running": "cyan"}
    for v in views:
        r = max(v.round, 0)
        acc = "-"
        if v.start_acc is not None:
            acc = _pct(v.start_acc)
            if v.end_acc is not None and len(v.acc) > 1:
                delta = v.end_acc - v.start_acc
                color = "green" if delta > 0 else ("red" if delta < 0 else "white")
                acc = Text.assemble(f"{_pct(v.start_acc)} → ", (f"{_pct(v.end_acc)}", f"bold {color}"))
        peers, groups = v.last(PEERS), v.last(PEER_GROUPS_USED, 10)
        table.add_row(
            v.name + (f" [dim]{v.kind}[/dim]" if v.kind else ""), Text(v.model + (f"\n{v.params}" if v.params else ""), style="dim"),
            f"{r}/{v.rounds}", ProgressBar(total=max(v.rounds, 1), completed=r, width=12),
            _frac(v.last(REWARD_MEAN, 10)), acc,
            "-" if peers is None else str(int(peers)), "-" if groups is None else f"{groups:.1f}",
            _frac(v.last(DROPPED_FRAC, 10)), _frac(v.last(TRUNCATED_FRAC, 10)),
            "-" if v.last(TIME_ROUND) is None else f"{v.last(TIME_ROUND, 5):.1f}",
            Text(v.status, style=styles.get(v.status, "")))
    return table


class LiveView:
    """Redraws the node table on a terminal; prints one plain line per evaluation elsewhere."""

    def __init__(self, console: Console, views: list[NodeView], title: str, caption: str = ""):
        self.console, self.views, self.title, self.caption = console, views, title, caption
        self.start = time.monotonic()
        self.live: Live | None = None
        self._reported: dict[str, str] = {}

    def __enter__(self) -> "LiveView":
        if self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)

    def _render(self) -> Table:
        elapsed = time.monotonic() - self.start
        return node_table(self.views, f"{self.title}   [dim]{int(elapsed) // 60}:{int(elapsed) % 60:02d}[/dim]",
                          self.caption)

    def refresh(self) -> None:
        """Poll every node's files and redraw (or print what is new)."""
        for v in self.views:
            for row in v.poll():
                if self.live is None and row.get(EVAL_ACCURACY) is not None:
                    peers = v.last(PEERS)
                    self.console.print(f"  {v.name:>12} {v.kind} round {row.get(ROUND)}/{v.rounds}: held-out acc "
                                       f"{_pct(row[EVAL_ACCURACY])}, reward {_frac(v.last(REWARD_MEAN, 10))}, "
                                       f"peers {'-' if peers is None else int(peers)}", highlight=False)
            if self.live is None and v.status in ("done", "failed", "stopped") and self._reported.get(v.name) != v.status:
                self._reported[v.name] = v.status
                self.console.print(f"  {v.name:>12} {v.kind} {v.status}", highlight=False)
        if self.live is not None:
            self.live.update(self._render())


def summary_table(rows: list[dict], title: str) -> Table:
    """The end-of-demo table: each node's start and end held-out accuracy (per run kind)."""
    table = Table(title=title, title_style="bold")
    with_kind = any(row.get("kind") for row in rows)
    columns = [("node", "left"), ("run", "left"), ("model", "left"), ("warm start\n(round 0)", "right"),
               ("end", "right"), ("change", "right"), ("best", "right"), ("eval n", "right")]
    for name, justify in columns:
        if name != "run" or with_kind:
            table.add_column(name, justify=justify, no_wrap=name in ("node", "model"))
    for row in rows:
        delta = row["end"] - row["start"]
        cells = [row["node"], row.get("kind", ""), row.get("model", ""), _pct(row["start"]),
                 Text(_pct(row["end"]), style="bold"),
                 Text(f"{100 * delta:+.1f} pts", style="green" if delta > 0 else "red"),
                 _pct(row["best"]), str(row["n"])]
        table.add_row(*(cells if with_kind else cells[:1] + cells[2:]))
    return table


def summary_markdown(rows: list[dict]) -> str:
    """The same table as Markdown (written to summary.md, ready to paste into a README)."""
    lines = ["| node | run | model | warm start (round 0) | end | change |", "|---|---|---|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['node']} | {row.get('kind', '') or '-'} | {row.get('model', '')} | {_pct(row['start'])} "
                     f"| {_pct(row['end'])} | {100 * (row['end'] - row['start']):+.1f} pts |")
    return "\n".join(lines) + "\n"

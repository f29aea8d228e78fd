"""The demo's terminal side: warm start with progress bars, a live table of the nodes, the summary.

The live table only *reads*: the node processes write OUT/metrics.jsonl (one JSON row per
round) and OUT/node.log, and `NodeView` tails them. On a terminal the table redraws in place
(rich.Live); elsewhere (CI logs, pipes) the same information is printed as plain lines, one
per held-out evaluation and one per node that finishes.

The warm start runs in `spawn`ed worker processes (one per distinct recipe, as many at once as
there are CPUs) that report every few steps through a queue; the result lands in
warmstart.py's cache, where the node processes then find it.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, ProgressBar, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from swarm_node.config import load_config


class WarmStartError(RuntimeError):
    """A warm-start worker failed; the message says which and why."""


_LOADED = re.compile(r"loaded \S+ on \S+ \([^)]*\): ([\d.]+)M params, ([\d.]+)M trainable")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _frac(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


@dataclass
class NodeView:
    """What the live table knows about one node, from tailing its metrics.jsonl and node.log."""

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
            if row.get("eval/accuracy") is not None:
                self.acc.append((int(row.get("round", 0)), float(row["eval/accuracy"])))
        if new and self.status in ("waiting", "starting"):
            self.status = "running"
        return new

    def _read_params(self) -> None:
        try:
            match = _LOADED.search((self.out / "node.log").read_text(errors="replace"))
        except OSError:
            return
        if match:
            self.params = f"{float(match.group(1)):.2f}M params"

    # ---- derived values ----------------------------------------------------------------------
    @property
    def round(self) -> int:
        return max((int(r["round"]) for r in self.rows if "round" in r), default=-1)

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
        peers, groups = v.last("swarm/peers"), v.last("swarm/peer_groups_used", 10)
        table.add_row(
            v.name + (f" [dim]{v.kind}[/dim]" if v.kind else ""), Text(v.model + (f"\n{v.params}" if v.params else ""), style="dim"),
            f"{r}/{v.rounds}", ProgressBar(total=max(v.rounds, 1), completed=r, width=12),
            _frac(v.last("reward/mean", 10)), acc,
            "-" if peers is None else str(int(peers)), "-" if groups is None else f"{groups:.1f}",
            _frac(v.last("filter/dropped_frac", 10)), _frac(v.last("is/truncated_frac", 10)),
            "-" if v.last("time/round_s") is None else f"{v.last('time/round_s', 5):.1f}",
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
                if self.live is None and row.get("eval/accuracy") is not None:
                    peers = v.last("swarm/peers")
                    self.console.print(f"  {v.name:>12} {v.kind} round {row.get('round')}/{v.rounds}: held-out acc "
                                       f"{_pct(row['eval/accuracy'])}, reward {_frac(v.last('reward/mean', 10))}, "
                                       f"peers {'-' if peers is None else int(peers)}", highlight=False)
            if self.live is None and v.status in ("done", "failed", "stopped") and self._reported.get(v.name) != v.status:
                self._reported[v.name] = v.status
                self.console.print(f"  {v.name:>12} {v.kind} {v.status}", highlight=False)
        if self.live is not None:
            self.live.update(self._render())


def warmstart_progress(console: Console) -> Progress:
    """Progress bars for the supervised warm starts (one per distinct recipe)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=30), TaskProgressColumn(),
                    TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("eta"),
                    TimeRemainingColumn(), console=console, transient=False, disable=not console.is_terminal)


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


# ---- warm start: worker processes report progress through a queue ------------------------------------
def _recipe(cfg) -> tuple:
    # Mirrors warmstart.warmstarted_model's cache key: nodes with equal recipes share one warm start.
    return (cfg.model.name, cfg.model.init_seed, cfg.task.name, json.dumps(cfg.task.options, sort_keys=True),
            cfg.train.warmstart_steps, cfg.train.warmstart_lr, cfg.train.warmstart_batch)


def _warmstart_worker(key: int, config_path: str, overrides: list[str], events, env: dict) -> None:
    os.environ.update(env)
    try:
        import torch

        from swarm_node.tasks import load_task
        from swarm_node.warmstart import warmstarted_model

        cfg = load_config(config_path, overrides)
        torch.set_num_threads(max(cfg.threads, 1))
        task = load_task(cfg.task.name, cfg.task.data, **cfg.task.options)
        trained = []

        def on_step(step: int, loss: float) -> None:
            trained.append(step)
            if step == 1 or step % 5 == 0 or step == cfg.train.warmstart_steps:
                events.put(("step", key, step, loss))

        path = warmstarted_model(cfg, task, on_step=on_step)
        events.put(("done", key, path, not trained))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the demo
        if not isinstance(e, KeyboardInterrupt):
            events.put(("error", key, f"{e.__class__.__name__}: {e}\n{traceback.format_exc(limit=3)}"))


def warm_start(specs: list, console: Console, env: dict[str, str], critical=contextlib.nullcontext) -> None:
    """Train (or find cached) the warm start of every demo node (`demo.NodeSpec`), several at once,
    with progress bars. `critical()` guards starting a worker (see demo._Signals)."""
    groups: dict[tuple, list] = {}
    for spec in specs:
        if spec.cfg.train.warmstart_steps > 0:
            groups.setdefault(_recipe(spec.cfg), []).append(spec)
    if not groups:
        return
    jobs = list(groups.values())
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold torch threads
    events = ctx.Queue()
    parallel = max(1, min(len(jobs), os.cpu_count() or 1))
    workers: dict[int, multiprocessing.Process] = {}
    pending, done, printed_at = list(range(len(jobs))), set(), {}
    console.print(f"[bold]Warm start[/bold]: {len(jobs)} supervised phase(s) on [cyan]{specs[0].cfg.task.name}[/cyan] "
                  f"so GRPO has signal (cached in $SWARM_NODE_CACHE or ~/.cache/swarm-node)", soft_wrap=True)
    with warmstart_progress(console) as progress:
        bars = {}
        for k, group in enumerate(jobs):
            cfg = group[0].cfg
            shared = f" (shared by {', '.join(s.name for s in group)})" if len(group) > 1 else ""
            bars[k] = progress.add_task(f"{cfg.model.name}{shared}", total=cfg.train.warmstart_steps, loss="-")
        try:
            while len(done) < len(jobs):
                while pending and sum(w.is_alive() for w in workers.values()) < parallel:
                    k = pending.pop(0)
                    spec = jobs[k][0]
                    with critical():
                        workers[k] = ctx.Process(target=_warmstart_worker, daemon=True,
                                                 args=(k, str(spec.config_path), spec.overrides, events, env))
                        workers[k].start()
                try:
                    event = events.get(timeout=0.5)
                except queue.Empty:
                    for k, w in workers.items():  # killed without a word (e.g. out of memory)
                        if k not in done and not w.is_alive() and w.exitcode not in (0, None):
                            raise WarmStartError(f"warm start of {jobs[k][0].cfg.model.name} died "
                                                 f"(exit code {w.exitcode})") from None
                    continue
                kind, k = event[0], event[1]
                cfg = jobs[k][0].cfg
                if kind == "step":
                    progress.update(bars[k], completed=event[2], loss=f"{event[3]:.3f}")
                    if not console.is_terminal and time.monotonic() - printed_at.get(k, 0.0) > 15:
                        printed_at[k] = time.monotonic()
                        console.print(f"  warm start {cfg.model.name}: step {event[2]}/{cfg.train.warmstart_steps}, "
                                      f"loss {event[3]:.3f}", highlight=False)
                elif kind == "done":
                    done.add(k)
                    progress.update(bars[k], completed=cfg.train.warmstart_steps)
                    if event[3]:
                        progress.update(bars[k], description=f"{cfg.model.name}: cached", loss="-")
                        console.print(f"  warm start {cfg.model.name}: reusing cached {event[2]} "
                                      "(delete it to train again)", highlight=False, soft_wrap=True)
                    else:
                        console.print(f"  warm start {cfg.model.name}: saved to {event[2]} "
                                      "(the next run will reuse it)", highlight=False, soft_wrap=True)
                else:
                    raise WarmStartError(f"warm start of {cfg.model.name} failed: {event[2]}")
        finally:
            for w in workers.values():
                if w.is_alive():
                    w.terminate()
                w.join(5)
                if w.is_alive():
                    w.kill()
            events.close()
            events.join_thread()

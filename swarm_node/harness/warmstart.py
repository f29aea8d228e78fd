"""Warm starts, run before the nodes start, so their processes find the model cached and skip their own.

`public_warm_start`: one recipe of a tiny preset on arith, the model every node of that recipe
starts from; benchmarks and tests hand it to attackers as their copy of a victim's round 0.

`warm_start`: the demo's, several at once with progress bars. Nodes whose warm-start recipes are equal (`swarm_node.train.warmstart.warmstart_path`: the cache
directory of a recipe) share one supervised phase. Each runs in a `spawn`ed worker process (as
many at once as there are CPUs) that reports every few steps through a queue; the result lands in
warmstart.py's cache, where the node processes then find it and skip their own warm start.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue
import time
import traceback

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from swarm_node.config import load_config

REPORT_EVERY = 5  # steps between progress events from a worker
PLAIN_EVERY_S = 15.0  # seconds between plain progress lines when the console is not a terminal


def public_warm_start(steps: int, task_options: dict | None = None, model: str = "tiny-s") -> str:
    """The path of `model` warm-started for `steps` supervised steps on arith (`task_options`), trained
    on first use (on one torch thread, as a node of the recipe would) and cached (train.warmstart); a
    node with the same recipe starts from the same weights."""
    import torch

    from swarm_node.tasks import load_task
    from swarm_node.train.warmstart import warmstarted_model

    sets = [f"model.name={model}", "task.name=arith", f"train.warmstart_steps={steps}", "threads=1"]
    if task_options is not None:
        sets.append(f"task.options={json.dumps(task_options)}")
    cfg = load_config(None, sets)
    torch.set_num_threads(cfg.threads)
    return warmstarted_model(cfg, load_task("arith", None, **cfg.task.options))


class WarmStartError(RuntimeError):
    """A warm-start worker failed; the message says which and why."""


def warmstart_progress(console: Console) -> Progress:
    """Progress bars for the supervised warm starts (one per distinct recipe)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=30), TaskProgressColumn(),
                    TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), TextColumn("eta"),
                    TimeRemainingColumn(), console=console, transient=False, disable=not console.is_terminal)


def group_by_recipe(specs: list) -> list[list]:
    """The specs (`run.NodeSpec`) that warm-start, grouped by recipe (first-seen order): one phase per group."""
    from swarm_node.train.defaults import resolve_model_defaults
    from swarm_node.train.warmstart import warmstart_path  # imports torch: only when there is a warm start to run

    groups: dict[str, list] = {}
    for spec in specs:
        cfg, _ = resolve_model_defaults(spec.cfg)
        if cfg.train.warmstart_steps > 0:
            groups.setdefault(str(warmstart_path(cfg)), []).append(spec)
    return list(groups.values())


def _worker(key: int, config_path: str, overrides: list[str], events, env: dict) -> None:
    """In a spawned process: train (or find cached) one warm start, reporting through `events`."""
    os.environ.update(env)
    try:
        import torch

        from swarm_node.tasks import load_task
        from swarm_node.train.defaults import resolve
        from swarm_node.train.warmstart import warmstarted_model

        cfg = load_config(config_path, overrides)
        task = load_task(cfg.task.name, cfg.task.data, **cfg.task.options)
        cfg, _ = resolve(cfg, task)
        torch.set_num_threads(max(cfg.threads, 1))
        trained = []

        def on_step(step: int, loss: float) -> None:
            trained.append(step)
            if step == 1 or step % REPORT_EVERY == 0 or step == cfg.train.warmstart_steps:
                events.put(("step", key, step, loss))

        path = warmstarted_model(cfg, task, on_step=on_step)
        events.put(("done", key, path, not trained))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the demo
        if not isinstance(e, KeyboardInterrupt):
            events.put(("error", key, f"{e.__class__.__name__}: {e}\n{traceback.format_exc(limit=3)}"))


class WarmStartPool:
    """Runs one worker per recipe group, at most `parallel` at once, and shows their progress."""

    def __init__(self, jobs: list[list], console: Console, env: dict[str, str], critical=contextlib.nullcontext):
        self.jobs, self.console, self.env, self.critical = jobs, console, env, critical
        self.ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold torch threads
        self.events = self.ctx.Queue()
        self.parallel = max(1, min(len(jobs), os.cpu_count() or 1))
        self.workers: dict[int, multiprocessing.Process] = {}
        self.pending, self.done, self.printed_at = list(range(len(jobs))), set(), {}
        self.progress, self.bars = None, {}

    def run(self) -> None:
        with warmstart_progress(self.console) as self.progress:
            for k, group in enumerate(self.jobs):
                cfg = group[0].cfg
                shared = f" (shared by {', '.join(s.name for s in group)})" if len(group) > 1 else ""
                self.bars[k] = self.progress.add_task(f"{cfg.model.name}{shared}", total=cfg.train.warmstart_steps,
                                                      loss="-")
            try:
                while len(self.done) < len(self.jobs):
                    self._start_workers()
                    try:
                        event = self.events.get(timeout=0.5)
                    except queue.Empty:
                        self._check_dead()
                        continue
                    self._handle(event)
            finally:
                self._stop_workers()

    def _start_workers(self) -> None:
        while self.pending and sum(w.is_alive() for w in self.workers.values()) < self.parallel:
            k = self.pending.pop(0)
            spec = self.jobs[k][0]
            with self.critical():
                self.workers[k] = self.ctx.Process(target=_worker, daemon=True,
                                                   args=(k, str(spec.config_path), spec.overrides, self.events, self.env))
                self.workers[k].start()

    def _check_dead(self) -> None:
        for k, w in self.workers.items():  # killed without a word (e.g. out of memory)
            if k not in self.done and not w.is_alive() and w.exitcode not in (0, None):
                raise WarmStartError(f"warm start of {self.jobs[k][0].cfg.model.name} died (exit code {w.exitcode})")

    def _handle(self, event: tuple) -> None:
        kind, k = event[0], event[1]
        cfg = self.jobs[k][0].cfg
        name, steps = cfg.model.name, cfg.train.warmstart_steps
        if kind == "step":
            self.progress.update(self.bars[k], completed=event[2], loss=f"{event[3]:.3f}")
            if not self.console.is_terminal and time.monotonic() - self.printed_at.get(k, 0.0) > PLAIN_EVERY_S:
                self.printed_at[k] = time.monotonic()
                self.console.print(f"  warm start {name}: step {event[2]}/{steps}, loss {event[3]:.3f}", highlight=False)
        elif kind == "done":
            self.done.add(k)
            self.progress.update(self.bars[k], completed=steps)
            if event[3]:
                self.progress.update(self.bars[k], description=f"{name}: cached", loss="-")
                self.console.print(f"  warm start {name}: reusing cached {event[2]} (delete it to train again)",
                                   highlight=False, soft_wrap=True)
            else:
                self.console.print(f"  warm start {name}: saved to {event[2]} (the next run will reuse it)",
                                   highlight=False, soft_wrap=True)
        else:
            raise WarmStartError(f"warm start of {name} failed: {event[2]}")

    def _stop_workers(self) -> None:
        for w in self.workers.values():
            if w.is_alive():
                w.terminate()
            w.join(5)
            if w.is_alive():
                w.kill()
        self.events.close()
        self.events.join_thread()


def warm_start(specs: list, console: Console, env: dict[str, str], critical=contextlib.nullcontext) -> None:
    """Train (or find cached) the warm start of every demo node (`run.NodeSpec`), several at once,
    with progress bars. `critical()` guards starting a worker (see signals.SIGNALS)."""
    jobs = group_by_recipe(specs)
    if not jobs:
        return
    console.print(f"[bold]Warm start[/bold]: {len(jobs)} supervised phase(s) on [cyan]{specs[0].cfg.task.name}[/cyan] "
                  f"so GRPO has signal (cached in $SWARM_NODE_CACHE or ~/.cache/swarm-node)", soft_wrap=True)
    WarmStartPool(jobs, console, env, critical).run()

"""`swarm-node demo`: a heterogeneous swarm of real node processes on this machine, watched live.

    1. configs/demo/*.yaml        one file per node (the first one starts the swarm)
    2. warm start                 supervised steps on `arith` in worker processes, with progress
                                  bars; cached on disk, so a second run skips it (and says so)
                                  (harness/warmstart.py)
    3. swarm                      `swarm-node join` processes on 127.0.0.1: the first one's
                                  OUT/status.json gives its join address, the others join with
                                  --peers (the normal join path) (harness/process.py)
    4. live view                  tails every node's metrics.jsonl and status.json (demo/live.py)
    5. results                    runs/<timestamp>/: per node metrics.jsonl, node.log, console.log,
                                  status.json; accuracy.png, training.png, summary.md/json,
                                  commands.txt (demo/plots.py)

`--compare` repeats step 3 with the NoIS loss and then with each node alone (`swarm-node
train`, NoIS), same seeds, and adds compare.png (one panel per node).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from rich.console import Console

from swarm_node.commands.demo.live import LiveView, NodeView, summary_markdown, summary_table
from swarm_node.config import ConfigError, NodeConfig, load_config
from swarm_node.errors import SwarmNodeError
from swarm_node.harness.process import CHILD_ENV, REPO, NodeFailed, NodeProcess, remember_descendants
from swarm_node.harness.signals import SIGNALS, Interrupted, start, stop, stop_all_started
from swarm_node.harness.warmstart import WarmStartError, warm_start

LOCALHOST = "/ip4/127.0.0.1/tcp/0"
QUICK = {"train.rounds": 3, "train.warmstart_steps": 20, "task.eval_limit": 20, "train.eval_every": 0}
KINDS = {  # run kind -> (command, loss variant override or None for the config's own)
    "swarm-f-tis": ("join", None),
    "swarm-nois": ("join", "nois"),
    "alone": ("train", "nois"),
}


class DemoError(RuntimeError):
    """The demo cannot go on (a node failed, the swarm did not start); the message says why."""


class NoNodeConfigsError(SwarmNodeError, FileNotFoundError):
    """The demo's config directory is missing or holds no node configs."""


class RunDirError(SwarmNodeError, OSError):
    """The demo's --out directory holds an earlier run or cannot be written."""


@dataclass
class NodeSpec:
    """One node of the demo: its config file, the overrides applied to it, the resolved config."""

    config_path: Path
    overrides: list[str]
    cfg: NodeConfig

    @property
    def name(self) -> str:
        return self.cfg.name


def default_config_dir() -> Path:
    for candidate in (Path("configs/demo"), REPO / "configs" / "demo"):
        if candidate.is_dir():
            return candidate
    raise NoNodeConfigsError("configs/demo not found: run the demo from the repository root or pass --configs DIR")


def load_specs(config_dir: Path, overrides: list[str]) -> list[NodeSpec]:
    """The demo's nodes: every *.yaml in `config_dir`, in file-name order, with `overrides` applied."""
    paths = sorted(Path(config_dir).glob("*.yaml"))
    if not paths:
        raise NoNodeConfigsError(f"no *.yaml node configs in {config_dir}")
    from swarm_node.train.defaults import resolve_model_defaults

    specs = [NodeSpec(p, list(overrides), resolve_model_defaults(load_config(p, overrides))[0]) for p in paths]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"demo node names must differ, got {names} (set `name:` in each config)")
    return specs


def demo_overrides(rounds: int | None = None, warmstart_steps: int | None = None, eval_limit: int | None = None,
                   eval_every: int | None = None, quick: bool = False, sets: list[str] | None = None) -> list[str]:
    """--set style overrides for every node: --quick values, then the named flags, then --set."""
    values: dict[str, object] = dict(QUICK) if quick else {}
    for key, value in (("train.rounds", rounds), ("train.warmstart_steps", warmstart_steps),
                       ("task.eval_limit", eval_limit), ("train.eval_every", eval_every)):
        if value is not None:
            values[key] = value
    return [f"{k}={json.dumps(v)}" for k, v in values.items()] + list(sets or [])


def node_argv(spec: NodeSpec, command: str, out: Path, run_id: str, variant: str | None,
              peers: str | None = None) -> list[str]:
    """The exact `swarm-node join|train` command line for one node (also written to commands.txt)."""
    argv = [sys.executable, "-m", "swarm_node", command, "--config", str(spec.config_path), "--out", str(out)]
    if command == "join":
        argv += ["--identity", str(out / "identity.key"), "--host-maddrs", LOCALHOST, "--run-id", run_id]
        if peers:
            argv += ["--peers", peers]
    for item in spec.overrides:
        argv += ["--set", item]
    if variant:
        argv += ["--loss", variant]
    return argv


def _model(spec: NodeSpec) -> str:
    m = spec.cfg.model
    return f"{Path(m.name).name} + LoRA r={m.lora_r}" if m.lora_r else f"{Path(m.name).name}, full"


# ---- one run kind: start the nodes, watch them until all are done ---------------------------------
def wait_until_up(proc: NodeProcess, timeout: float, tick=lambda: None) -> dict:
    """The node's status once its swarm is up (`join_addrs` known) and its model loaded (`params`
    known); `tick()` runs while waiting."""
    try:
        return proc.status(lambda s: bool(s.get("join_addrs")) and s.get("params") is not None, timeout, tick=tick)
    except NodeFailed as e:
        if not e.exited:
            raise DemoError(f"node {proc.name} did not start its swarm within {timeout:.0f} s; see {proc.log}") from None
        raise DemoError(f"node {proc.name} exited (code {proc.popen.returncode}) before its swarm started; "
                        f"last lines of {proc.log}:\n{proc.text(15)}") from None


def _start_nodes(specs: list[NodeSpec], procs: list[NodeProcess], views: list[NodeView], kind: str, run_id: str,
                 commands, live: LiveView, console: Console, start_timeout: float) -> None:
    """Start every node; in a swarm, the first one's join address (from its status.json) is the others' --peers."""
    command, variant = KINDS[kind]
    first_maddr = None
    for i, (spec, proc, view) in enumerate(zip(specs, procs, views)):
        proc.argv = node_argv(spec, command, proc.out, run_id, variant, first_maddr)
        commands.write(shlex.join(["swarm-node", *proc.argv[3:]]) + "\n")
        start(proc)
        view.status = "starting"
        if command == "join" and i == 0:
            first_maddr = wait_until_up(proc, start_timeout, live.refresh)["join_addrs"][0]
            console.print(f"  swarm started by {proc.name}: {first_maddr}", highlight=False, soft_wrap=True)
    commands.flush()


def _watch(procs: list[NodeProcess], views: list[NodeView], live: LiveView) -> None:
    """Refresh the live view until every node exited 0; a node that fails fails the demo."""
    while True:
        remember_descendants(procs)
        for proc, view in zip(procs, views):
            code = proc.popen.poll()
            if code is not None and view.status not in ("done", "failed"):
                view.poll()
                view.status = "done" if code == 0 else "failed"
        live.refresh()
        failed = [p for p, v in zip(procs, views) if v.status == "failed"]
        if failed:
            p = failed[0]
            raise DemoError(f"node {p.name} failed (exit code {p.popen.returncode}); last lines of {p.log}:\n"
                            f"{p.text(15)}")
        if all(v.status == "done" for v in views):
            return
        time.sleep(0.5)


def run_kind(specs: list[NodeSpec], kind: str, out: Path, run_id: str, console: Console,
             start_timeout: float = 180.0) -> list[NodeView]:
    """Run every node once as `kind` (swarm-f-tis | swarm-nois | alone) with the live view."""
    command, variant = KINDS[kind]
    label = kind if out.name == kind else ""
    procs = [NodeProcess([], out / s.name) for s in specs]
    views = [NodeView(s.name, label, p.out, s.cfg.train.rounds, model=_model(s)) for s, p in zip(specs, procs)]
    what = "swarm on 127.0.0.1" if command == "join" else "each node alone (no peers)"
    title = f"swarm-node demo: {len(specs)} nodes, {what}, loss {variant or specs[0].cfg.loss.variant}"
    caption = f"outputs: {out}/<node>/   ·   Ctrl-C stops every node"
    commands = open(out / "commands.txt", "a")
    try:
        with LiveView(console, views, title, caption) as live:
            _start_nodes(specs, procs, views, kind, run_id, commands, live, console, start_timeout)
            _watch(procs, views, live)
    except BaseException:
        for v in views:
            if v.status not in ("done", "failed"):
                v.status = "stopped"
        raise
    finally:
        stop(procs)
        commands.close()
    return views


# ---- the whole demo -------------------------------------------------------------------------------
def results(run_dir: Path, console: Console) -> list[dict]:
    """Plots and the summary table of a finished run directory; returns the summary rows."""
    from swarm_node.commands.demo import plots  # matplotlib: only once the demo has results

    series = plots.load_runs([run_dir])
    paths = plots.plot_runs([run_dir], run_dir)
    rows = plots.accuracy_table(series)
    console.print()
    console.print(summary_table(rows, "Held-out accuracy (greedy pass@1) before and after RL"))
    (run_dir / "summary.md").write_text(summary_markdown(rows))
    (run_dir / "summary.json").write_text(json.dumps(rows, indent=1))
    for path in paths:
        console.print(f"  plot: {path}", highlight=False, soft_wrap=True)
    return rows


def _prepare(specs: list[NodeSpec], run_dir: Path, kinds: list[str], overrides: list[str], stamp: str,
             console: Console) -> None:
    """Refuse a directory that holds a run; write demo.json; say what is about to run."""
    if any(run_dir.glob("**/metrics.jsonl")):
        raise RunDirError(f"{run_dir} already holds a run; pick another --out (or leave it out)")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "demo.json").write_text(json.dumps({
            "nodes": [s.name for s in specs], "kinds": kinds, "configs": [str(s.config_path) for s in specs],
            "overrides": overrides, "started": stamp}, indent=1))
    except OSError as e:
        raise RunDirError(f"cannot write the run directory {run_dir}: {e.strerror or e}") from None
    console.print(f"[bold]swarm-node demo[/bold]: {len(specs)} nodes, {specs[0].cfg.train.rounds} rounds of "
                  f"{specs[0].cfg.task.name} -> {run_dir}/", highlight=False, soft_wrap=True)
    for spec in specs:
        console.print(f"  {spec.name}: {_model(spec)} fine-tuning, lr {spec.cfg.train.lr:g}, seed {spec.cfg.train.seed}",
                      highlight=False)


def _run_all(specs: list[NodeSpec], run_dir: Path, kinds: list[str], stamp: str, compare: bool,
             console: Console) -> None:
    """Warm start, every run kind, then plots and the summary."""
    started = time.monotonic()
    warm_start(specs, console, CHILD_ENV, SIGNALS.critical)
    for kind in kinds:
        kind_dir = run_dir / kind if compare else run_dir
        kind_dir.mkdir(parents=True, exist_ok=True)
        if compare:
            console.print(f"\n[bold]{kind}[/bold] ({kinds.index(kind) + 1}/{len(kinds)})")
        run_kind(specs, kind, kind_dir, f"demo-{stamp}-{kind}", console)
    rows = results(run_dir, console)
    minutes = (time.monotonic() - started) / 60
    better = sum(r["end"] > r["start"] for r in rows)
    console.print(f"\n{better}/{len(rows)} node runs ended above their warm-start accuracy; {minutes:.1f} min "
                  f"in all. Redraw or compare runs with: swarm-node plot {run_dir}", highlight=False, soft_wrap=True)


def run_demo(config_dir: Path | None = None, out: Path | None = None, overrides: list[str] | None = None,
             compare: bool = False, console: Console | None = None) -> int:
    """The whole demo; returns the process exit code (0 ok, 1 a node failed, 130 interrupted)."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and pipes: wide enough that tables and paths do not wrap
            console = Console(width=max(console.width, 130))
    specs = load_specs(config_dir or default_config_dir(), overrides or [])
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(out) if out is not None else Path("runs") / stamp
    kinds = list(KINDS) if compare else ["swarm-f-tis"]
    _prepare(specs, run_dir, kinds, overrides or [], stamp, console)
    with SIGNALS.installed():
        try:
            _run_all(specs, run_dir, kinds, stamp, compare, console)
            return 0
        except (Interrupted, KeyboardInterrupt):
            partial = f"; partial results in {run_dir}/ (draw them with: swarm-node plot {run_dir})" \
                if any(run_dir.glob("**/metrics.jsonl")) else ""
            console.print(f"\n[yellow]interrupted[/yellow]: every node process was stopped{partial}", highlight=False,
                          soft_wrap=True)
            return 130
        except (DemoError, WarmStartError) as e:
            console.print(f"[bold red]demo failed[/bold red]: {e}", highlight=False, soft_wrap=True)
            return 1
        finally:
            stop_all_started()

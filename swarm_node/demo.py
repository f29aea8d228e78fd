"""`swarm-node demo`: a heterogeneous swarm of real node processes on this machine, watched live.

    1. configs/demo/*.yaml        one file per node (the first one starts the swarm)
    2. warm start                 supervised steps on `arith` in worker processes, with progress
                                  bars; cached on disk, so a second run skips it (and says so)
    3. swarm                      `swarm-node join` processes on 127.0.0.1: the first prints its
                                  multiaddr, the others join with --peers (the normal join path)
    4. live view                  tails every node's metrics.jsonl (swarm_node/live.py)
    5. results                    runs/<timestamp>/: per node metrics.jsonl, node.log, console.log;
                                  accuracy.png, training.png, summary.md/json, commands.txt

`--compare` repeats step 3 with the NoIS loss and then with each node alone (`swarm-node
train`, NoIS), same seeds, and adds compare.png (one panel per node).

Node processes run in their own sessions (process groups), so a terminal Ctrl-C reaches only
this process, which stops them in order: SIGINT (the node shuts its p2pd down and exits),
then SIGTERM, then SIGKILL to the whole group, then any descendant that survived.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from rich.console import Console

from swarm_node.config import ConfigError, NodeConfig, load_config
from swarm_node.live import LiveView, NodeView, WarmStartError, summary_markdown, summary_table, warm_start

REPO = Path(__file__).resolve().parents[1]
LOCALHOST = "/ip4/127.0.0.1/tcp/0"
JOIN_LINE = re.compile(r"--peers (/\S+)")
QUICK = {"train.rounds": 3, "train.warmstart_steps": 20, "task.eval_limit": 20, "train.eval_every": 0}
KINDS = {  # run kind -> (command, loss variant override or None for the config's own)
    "swarm-f-tis": ("join", None),
    "swarm-nois": ("join", "nois"),
    "alone": ("train", "nois"),
}
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
             "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


class DemoError(RuntimeError):
    """The demo cannot go on (a node failed, the swarm did not start); the message says why."""


class Interrupted(Exception):
    """SIGINT / SIGTERM received by the demo process."""


class _Signals:
    """SIGINT/SIGTERM -> `Interrupted`, except inside `critical()` (starting a child and recording
    its pid), where the signal is held until the section ends, so no child is ever left untracked;
    and while stopping children, where a second Ctrl-C only says "hurry" (skip the grace periods)."""

    def __init__(self):
        self.critical_depth, self.pending, self.stopping, self.hurry = 0, None, False, False

    def handler(self, signum, frame):
        if self.stopping:
            self.hurry = True
        elif self.critical_depth:
            self.pending = signum
        else:
            raise Interrupted(signal.Signals(signum).name)

    @contextlib.contextmanager
    def critical(self):
        self.critical_depth += 1
        try:
            yield
        finally:
            self.critical_depth -= 1
            if not self.critical_depth and self.pending is not None and not self.stopping:
                signum, self.pending = self.pending, None
                raise Interrupted(signal.Signals(signum).name)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


SIGNALS = _Signals()
STARTED: list["NodeProc"] = []  # every node process this demo started, stopped again on the way out


@dataclass
class NodeSpec:
    """One node of the demo: its config file, the overrides applied to it, the resolved config."""

    config_path: Path
    overrides: list[str]
    cfg: NodeConfig

    @property
    def name(self) -> str:
        return self.cfg.name


@dataclass
class NodeProc:
    spec: NodeSpec
    out: Path
    argv: list[str]
    popen: subprocess.Popen | None = None
    log_file: object = None
    descendants: dict = field(default_factory=dict)  # pid -> psutil.Process, refreshed while it runs


def default_config_dir() -> Path:
    for candidate in (Path("configs/demo"), REPO / "configs" / "demo"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("configs/demo not found: run the demo from the repository root or pass --configs DIR")


def load_specs(config_dir: Path, overrides: list[str]) -> list[NodeSpec]:
    """The demo's nodes: every *.yaml in `config_dir`, in file-name order, with `overrides` applied."""
    paths = sorted(Path(config_dir).glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"no *.yaml node configs in {config_dir}")
    specs = [NodeSpec(p, list(overrides), load_config(p, overrides)) for p in paths]
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


# ---- node processes -------------------------------------------------------------------------------
def _child_env() -> dict[str, str]:
    env = {**os.environ, **CHILD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


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


def _start(proc: NodeProc) -> None:
    proc.out.mkdir(parents=True, exist_ok=True)
    with SIGNALS.critical():
        STARTED.append(proc)
        proc.log_file = open(proc.out / "console.log", "ab")
        proc.popen = subprocess.Popen(proc.argv, stdout=proc.log_file, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=_child_env(), start_new_session=True)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _remember_descendants(procs: list[NodeProc]) -> None:
    import psutil

    for p in procs:
        if p.popen is None or p.popen.poll() is not None:
            continue
        try:
            for child in psutil.Process(p.popen.pid).children(recursive=True):
                p.descendants.setdefault(child.pid, child)
        except psutil.Error:
            pass


def stop_processes(procs: list[NodeProc], grace_int: float = 15.0, grace_term: float = 5.0) -> None:
    """Stop every node process and everything it started: SIGINT (the node closes its swarm and
    p2pd itself), then SIGTERM and SIGKILL to its process group, then any remembered descendant
    still alive. A Ctrl-C meanwhile skips the remaining grace periods."""
    import psutil

    SIGNALS.stopping = True
    try:
        _remember_descendants(procs)
        running = [p for p in procs if p.popen is not None and p.popen.poll() is None]
        for sig, grace, group in ((signal.SIGINT, grace_int, False), (signal.SIGTERM, grace_term, True),
                                  (signal.SIGKILL, 5.0, True)):
            for p in running:
                try:
                    os.killpg(p.popen.pid, sig) if group else os.kill(p.popen.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + (0.5 if SIGNALS.hurry and sig != signal.SIGKILL else grace)
            while running and time.monotonic() < deadline:
                running = [p for p in running if p.popen.poll() is None]
                if SIGNALS.hurry and sig != signal.SIGKILL:
                    break
                time.sleep(0.1)
            running = [p for p in running if p.popen.poll() is None]
            if not running:
                break
        for p in procs:  # p2pd and anything else a node started, if it outlived its node
            for child in p.descendants.values():
                try:
                    if child.is_running():
                        child.kill()
                except psutil.Error:
                    pass
            if p.log_file is not None:
                p.log_file.close()
                p.log_file = None
    finally:
        SIGNALS.stopping = SIGNALS.hurry = False
        SIGNALS.pending = None


def _wait_for_multiaddr(proc: NodeProc, timeout: float, tick=lambda: None) -> str:
    """The first node's `--peers` address, from the line it prints once its swarm is up."""
    deadline = time.monotonic() + timeout
    log = proc.out / "console.log"
    while time.monotonic() < deadline:
        tick()
        try:
            match = JOIN_LINE.search(log.read_text(errors="replace"))
        except OSError:
            match = None
        if match:
            return match.group(1)
        if proc.popen.poll() is not None:
            raise DemoError(f"node {proc.spec.name} exited (code {proc.popen.returncode}) before its swarm "
                            f"started; last lines of {log}:\n{_tail(log)}")
        time.sleep(0.2)
    raise DemoError(f"node {proc.spec.name} did not print its multiaddr within {timeout:.0f} s; see {log}")


def run_kind(specs: list[NodeSpec], kind: str, out: Path, run_id: str, console: Console,
             start_timeout: float = 180.0) -> list[NodeView]:
    """Run every node once as `kind` (swarm-f-tis | swarm-nois | alone) with the live view."""
    command, variant = KINDS[kind]
    label = kind if out.name == kind else ""
    procs = [NodeProc(s, out / s.name, []) for s in specs]
    views = [NodeView(s.name, label, p.out, s.cfg.train.rounds, model=_model(s)) for s, p in zip(specs, procs)]
    what = "swarm on 127.0.0.1" if command == "join" else "each node alone (no peers)"
    title = f"swarm-node demo: {len(specs)} nodes, {what}, loss {variant or specs[0].cfg.loss.variant}"
    caption = f"outputs: {out}/<node>/   ·   Ctrl-C stops every node"
    commands = open(out / "commands.txt", "a")
    try:
        with LiveView(console, views, title, caption) as live:
            for i, (proc, view) in enumerate(zip(procs, views)):
                peers = None if command == "train" or i == 0 else first_maddr
                proc.argv = node_argv(proc.spec, command, proc.out, run_id, variant, peers)
                commands.write(shlex.join(["swarm-node", *proc.argv[3:]]) + "\n")
                _start(proc)
                view.status = "starting"
                if command == "join" and i == 0:
                    first_maddr = _wait_for_multiaddr(proc, start_timeout, live.refresh)
                    console.print(f"  swarm started by {proc.spec.name}: {first_maddr}", highlight=False,
                                  soft_wrap=True)
            commands.flush()
            while True:
                _remember_descendants(procs)
                for proc, view in zip(procs, views):
                    code = proc.popen.poll()
                    if code is not None and view.status not in ("done", "failed"):
                        view.poll()
                        view.status = "done" if code == 0 else "failed"
                live.refresh()
                failed = [p for p, v in zip(procs, views) if v.status == "failed"]
                if failed:
                    p = failed[0]
                    raise DemoError(f"node {p.spec.name} failed (exit code {p.popen.returncode}); last lines of "
                                    f"{p.out / 'console.log'}:\n{_tail(p.out / 'console.log')}")
                if all(v.status == "done" for v in views):
                    break
                time.sleep(0.5)
    except BaseException:
        for v in views:
            if v.status not in ("done", "failed"):
                v.status = "stopped"
        raise
    finally:
        stop_processes(procs)
        commands.close()
    return views


# ---- the whole demo -------------------------------------------------------------------------------
def results(run_dir: Path, console: Console) -> list[dict]:
    """Plots and the summary table of a finished run directory; returns the summary rows."""
    from swarm_node import plots

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
    if any(run_dir.glob("**/metrics.jsonl")):
        raise FileExistsError(f"{run_dir} already holds a run; pick another --out (or leave it out)")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "demo.json").write_text(json.dumps({
        "nodes": [s.name for s in specs], "kinds": kinds, "configs": [str(s.config_path) for s in specs],
        "overrides": overrides or [], "started": stamp}, indent=1))
    started = time.monotonic()
    console.print(f"[bold]swarm-node demo[/bold]: {len(specs)} nodes, {specs[0].cfg.train.rounds} rounds of "
                  f"{specs[0].cfg.task.name} -> {run_dir}/", highlight=False, soft_wrap=True)
    for spec in specs:
        console.print(f"  {spec.name}: {_model(spec)} fine-tuning, lr {spec.cfg.train.lr:g}, seed {spec.cfg.train.seed}",
                      highlight=False)
    with SIGNALS.installed():
        try:
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
                          f"in all. Redraw or compare runs with: swarm-node plot {run_dir}", highlight=False,
                          soft_wrap=True)
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
            while True:  # a signal can land between two statements of a finally block: make sure
                try:
                    stop_processes(STARTED)
                    break
                except Interrupted:
                    continue
            STARTED.clear()

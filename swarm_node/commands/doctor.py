"""`swarm-node doctor`: the checks a volunteer runs before joining, as one table with a remedy per problem.

    run_checks(model, peers, config_path, gpu_smoke) -> [Check(name, status, detail, remedy)]
    render(checks)                                   -> the table (what the command prints)
    doctor_command                                   -> the typer command (`app.command("doctor")`)

Checks, in order: python, torch, cuda, gpu, bf16, model, memory, libp2p, peers, listen address,
reachable from outside, task data, disk, gpu smoke. Status is ok | warn | fail | skip; GPU checks
on a machine without one are `skip` with "no GPU". Nothing is faked: the reachability of this
node from outside is not measured yet (see the transport issue) and says so as a warning. The
command exits 1 if any check failed.

The libp2p check starts a real transport with a throwaway identity for a few seconds; meanwhile
the run's peers see it in their peer lists (model id `swarm-node-doctor`, serving no packets).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from swarm_node.errors import SwarmNodeError
from swarm_node.train.models import (ModelDims, estimate_for_config, fit_memory, fmt_bytes, hub_reachable,
                                     looks_like_path, model_load_error, resolve_model_name, trainable_params)

__all__ = ["Check", "run_checks", "render", "doctor_command", "NO_GPU"]

NO_GPU = "no GPU"
ON_HUB = "on the hub (downloaded on first use)"
DEFAULT_PROMPT_TOKENS = 256  # prompt length assumed by the memory estimate for hub models


@dataclass
class Check:
    """One line of the doctor's table."""

    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    remedy: str = ""


def run_checks(model: str | None = None, peers: list[str] | None = None, config_path: str | None = None,
               gpu_smoke: bool = False, *, run_id: str | None = None, peer_wait_s: float = 20.0) -> list[Check]:
    """Every check, in table order; a check that cannot run reports why instead of raising."""
    checks = _guard("python", _environment_checks)
    checks += _guard("gpu", _gpu_checks)
    try:
        cfg = _load_config(config_path, model, peers, run_id)
    except SwarmNodeError as e:
        return checks + [Check("config", "fail", str(e), "fix the config file or the flags")]
    found: dict[str, ModelDims | None] = {}
    checks += _guard("model", lambda: _model_checks(cfg, found))
    dims = found.get("dims")
    checks += _guard("libp2p", lambda: _network_checks(cfg, peer_wait_s))
    checks += _guard("task data", lambda: [_task_check(cfg)])
    checks += _guard("disk", lambda: [_disk_check(cfg, dims)])
    checks += _guard("gpu smoke", lambda: [_smoke_check(gpu_smoke)])
    return checks


def _guard(name: str, make) -> list[Check]:
    """`make()`, or one failed check naming the unexpected error (SWARM_NODE_DEBUG=1 re-raises)."""
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - a doctor reports what broke instead of stopping
        if os.environ.get("SWARM_NODE_DEBUG"):
            raise
        return [Check(name, "fail", f"{type(e).__name__}: {e}", "unexpected; SWARM_NODE_DEBUG=1 shows the traceback")]


def _load_config(config_path, model, peers, run_id):
    """The config the node would run: file (or defaults), then the doctor's flags, validated."""
    from swarm_node.config import load_config

    flags = {"model.name": model, "swarm.peers": list(peers) if peers else None, "swarm.run_id": run_id}
    cfg = load_config(config_path, [f"{k}={json.dumps(v)}" for k, v in flags.items() if v is not None])
    return _with_defaults(cfg)


def _with_defaults(cfg):
    """The config as the node would resolve it (defaults.py); the task's own values need its data,
    so without it the generic ones stand in (the task-data check reports the problem)."""
    from swarm_node.tasks import load_task
    from swarm_node.train.defaults import resolve, resolve_model_defaults

    try:
        return resolve(cfg, load_task(cfg.task.name, cfg.task.data, **cfg.task.options))[0]
    except Exception:  # the task check says why; the other checks still run
        cfg = resolve_model_defaults(cfg)[0]
        rollout = dataclasses.replace(cfg.rollout, max_new_tokens=cfg.rollout.max_new_tokens or 256)
        task = dataclasses.replace(cfg.task, eval_limit=200 if cfg.task.eval_limit is None else cfg.task.eval_limit)
        return dataclasses.replace(cfg, rollout=rollout, task=task)


# ---------------------------------------------------------------------------------------------------
# Machine

def _environment_checks() -> list[Check]:
    import torch

    py = platform.python_version()
    checks = [Check("python", "ok" if sys.version_info >= (3, 10) else "fail", f"{py} ({sys.executable})",
                    "" if sys.version_info >= (3, 10) else "swarm-node needs Python >= 3.10"),
              Check("torch", "ok", f"{torch.__version__} (built for CUDA {torch.version.cuda or 'none: CPU build'})")]
    if torch.cuda.is_available():
        checks.append(Check("cuda", "ok", f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)"))
    elif shutil.which("nvidia-smi") and torch.version.cuda is None:
        checks.append(Check("cuda", "fail", "an NVIDIA driver is installed but this torch is a CPU build",
                            "install a CUDA build of torch (https://pytorch.org/get-started/locally/)"))
    elif shutil.which("nvidia-smi"):
        checks.append(Check("cuda", "fail", f"torch is built for CUDA {torch.version.cuda} but cannot use the GPU",
                            "update the NVIDIA driver, or install a torch build for the installed CUDA version"))
    else:
        checks.append(Check("cuda", "skip", NO_GPU))
    return checks


def _gpu_checks() -> list[Check]:
    import torch

    if not torch.cuda.is_available():
        return [Check("gpu", "skip", NO_GPU), Check("bf16", "skip", f"{NO_GPU} (the CPU computes in fp32)")]
    free, total = torch.cuda.mem_get_info()
    gpu = Check("gpu", "ok", f"{torch.cuda.get_device_name()}: {fmt_bytes(total)} total, {fmt_bytes(free)} free")
    if torch.cuda.is_bf16_supported():
        return [gpu, Check("bf16", "ok", "supported: bf16 compute, fp32 master weights")]
    return [gpu, Check("bf16", "warn", "not supported by this GPU: training runs in fp32 (twice the memory)",
                       "prefer LoRA (--lora-r 64) or a smaller model on this GPU")]


# ---------------------------------------------------------------------------------------------------
# Model and memory

def _model_checks(cfg, found: dict) -> list[Check]:
    """The model and memory checks; the model's sizes (or None) go to ``found["dims"]``."""
    name = cfg.model.name
    try:
        resolved = resolve_model_name(name)
    except SwarmNodeError as e:
        return [Check("model", "fail", str(e), "use a listed size or a full hub id"),
                Check("memory", "skip", "no model")]
    where = _model_source(name, resolved)
    dims = ModelDims.lookup(resolved)
    if dims is None and where == ON_HUB:
        dims = _hub_dims(resolved)
    found["dims"] = dims
    shown = f"{name} -> {resolved}" if resolved != name else name
    model = where if isinstance(where, Check) else Check("model", "ok", f"{shown}: {where}")
    return [model, _memory_check(cfg, dims)]


def _model_source(name: str, resolved: str) -> str | Check:
    """Where the model comes from, or a failed check whose detail is the line `join` would print."""
    from swarm_node.train.presets import PRESETS

    if resolved in PRESETS:
        return "built-in preset (random init, char tokenizer)"
    path = Path(resolved).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return f"local directory {path}"
    if looks_like_path(resolved) or path.exists():
        return Check("model", "fail", model_load_error(name, resolved, FileNotFoundError(resolved)),
                     "pass a model directory, a preset (tiny-s, tiny-m, tiny-l) or a hub id")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(resolved, local_files_only=True)
        return "in the local Hugging Face cache"
    except Exception:  # noqa: BLE001 - not cached: the hub decides
        ok, why = hub_reachable()
    if ok:
        return ON_HUB
    return Check("model", "fail", model_load_error(name, resolved, ConnectionError(why)),
                 "then check again with: swarm-node doctor --model DIR")


def _hub_dims(resolved: str) -> ModelDims | None:
    from transformers import AutoConfig

    try:
        return ModelDims.from_hf_config(AutoConfig.from_pretrained(resolved))
    except Exception:  # noqa: BLE001 - an unknown size only skips the memory estimate
        return None


def _device(setting: str) -> tuple[str, bool, int, str]:
    """For `model.device`: (device type, bf16 supported, bytes available to the run, what those bytes are)."""
    import psutil
    import torch

    if torch.cuda.is_available() and setting != "cpu":
        index = torch.device(setting).index if setting.startswith("cuda:") else None
        free = torch.cuda.mem_get_info(index)[0]
        return "cuda", torch.cuda.is_bf16_supported(), free, "free GPU memory"
    return "cpu", False, psutil.virtual_memory().available, "available RAM"


def _memory_check(cfg, dims: ModelDims | None) -> Check:
    if dims is None:
        return Check("memory", "skip", "model size unknown without downloading its config")
    device_type, bf16, available, what = _device(cfg.model.device)
    prompt_tokens = 48 if cfg.task.name == "arith" else DEFAULT_PROMPT_TOKENS
    e = estimate_for_config(cfg, dims, device_type, bf16, prompt_tokens, guard=cfg.swarm.guard_every > 0)
    fit = fit_memory(e, available, what)
    detail = (f"{e['precision']['note']}: weights {fmt_bytes(e['weights'])}, grads {fmt_bytes(e['grads'])}, "
              f"AdamW {fmt_bytes(e['optimizer'])}, guard {fmt_bytes(e['guard'])}, activations {fmt_bytes(e['activations'])} "
              f"({fmt_bytes(e['activations_checkpointed'])} checkpointed), logits {fmt_bytes(e['logits_chunk'])}, "
              f"KV cache {fmt_bytes(e['kv_cache'])}; {fit.message}")
    return Check("memory", fit.status, detail, fit.remedy)


# ---------------------------------------------------------------------------------------------------
# Network

def _open_transport(swarm_cfg):
    """An unstarted libp2p transport announcing itself as the doctor (it serves no packets)."""
    from swarm_node.net.hivemind import HivemindTransport

    return HivemindTransport(swarm_cfg, "swarm-node-doctor", "doctor")


def _network_checks(cfg, peer_wait_s: float) -> list[Check]:
    # an ephemeral identity: the configured key file may be held by a node running on this machine
    swarm_cfg = dataclasses.replace(cfg.swarm, identity=None)
    if importlib.util.find_spec("hivemind") is None:  # a GPU image or a bare environment: train works, join does not
        missing = "hivemind is not installed"
        return [Check("libp2p", "fail", "the network layer's package, hivemind, is not installed (`swarm-node train` "
                      "works without it; `join` does not)", "pip install 'hivemind>=1.1.10,<1.2' (or pip install -e .)"),
                Check("peers", "skip", missing), Check("listen address", "skip", missing),
                Check("reachable from outside", "skip", missing)]
    peer_check = None
    try:
        transport = _open_transport(swarm_cfg)
    except SwarmNodeError as e:  # a malformed --peers address
        peer_check = Check("peers", "fail", str(e), "copy the address from the peer's 'Others join this swarm "
                           "with' line")
        transport = _open_transport(dataclasses.replace(swarm_cfg, peers=[]))
    start = time.monotonic()
    try:
        transport.start()
    except SwarmNodeError as e:
        down = "libp2p daemon did not start"
        return [Check("libp2p", "fail", str(e), "check swarm.host_maddrs (a port in use?) and that p2pd can run"),
                Check("peers", "skip", down), Check("listen address", "skip", down),
                Check("reachable from outside", "skip", down)]
    try:
        up = f"p2pd started in {time.monotonic() - start:.1f} s, run {cfg.swarm.run_id!r}"
        checks = [Check("libp2p", "ok", up)]
        checks.append(peer_check or _peers_check(transport, swarm_cfg.peers, cfg.swarm.run_id, peer_wait_s))
        checks += [_listen_check(transport.join_addrs()), _reach_check(transport.reachability.line)]
    finally:
        transport.close()
    return checks


def _peer_id_of(maddr: str) -> str:
    return maddr.rstrip("/").rsplit("/p2p/", 1)[-1] if "/p2p/" in maddr else ""


def _peers_check(transport, peers: list[str], run_id: str, wait_s: float) -> Check:
    if not peers:
        return Check("peers", "skip", "no --peers given: a node with this config starts a new swarm")
    wanted = {_peer_id_of(m): m for m in peers}
    seen: set[str] = set()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not set(wanted) <= seen:
        seen |= {p.peer_id for p in transport.peers()}
        time.sleep(0.5)
    answered = [m for pid, m in wanted.items() if pid in seen]
    missing = [m for pid, m in wanted.items() if pid not in seen]
    if not missing:
        return Check("peers", "ok", f"{len(answered)}/{len(wanted)} answered in run {run_id!r}")
    status = "warn" if answered else "fail"
    return Check("peers", status, f"{len(answered)}/{len(wanted)} answered within {wait_s:.0f} s; silent: "
                 + ", ".join(missing), f"check that each peer is running with --run-id {run_id} and that its "
                 "port is reachable from here (firewall, NAT); one answering peer is enough to join")


def _listen_check(addrs: list[str]) -> Check:
    return Check("listen address", "ok" if addrs else "fail",
                 (addrs[0] + (f" (+{len(addrs) - 1} more)" if len(addrs) > 1 else "")) if addrs else "none",
                 "" if addrs else "set swarm.host_maddrs, e.g. /ip4/0.0.0.0/tcp/31337")


def _reach_check(line: str) -> Check:
    """The transport's start-up reachability line (a peer dialled us back, or we serve through a relay)."""
    if line.startswith("reachable") or line.startswith("behind NAT"):
        return Check("reachable from outside", "ok", line)
    if line.startswith("unreachable"):
        return Check("reachable from outside", "fail", line)  # the line names the remedy
    return Check("reachable from outside", "warn", line, "pass --peers: a peer checks by dialling back")


# ---------------------------------------------------------------------------------------------------
# Data, disk, smoke

def _task_check(cfg) -> Check:
    from swarm_node.tasks import load_task
    from swarm_node.tasks.data import DATA_ENV

    t = cfg.task
    wanted = [(t.name, t.data, t.options)] + [(n, d, o) for n, d, o in ((t.eval_task, t.eval_data, {}),
                                                                          (t.ood_task, t.ood_data, t.ood_options)) if n]
    loaded = []
    for name, data, options in wanted:
        needs_hub = name != "arith" and (data is None and not os.environ.get(DATA_ENV)
                                         or data is not None and not Path(data).expanduser().exists())
        reachable, why = hub_reachable() if needs_hub else (True, "")
        if not reachable:
            return Check("task data", "fail", f"{name}: its data comes from the hub, which is not reachable ({why})",
                         f"copy the dataset's train.jsonl/test.jsonl into a directory and --set task.data=DIR "
                         f"(or set {DATA_ENV})")
        try:
            task = load_task(name, data, **options)
        except (OSError, ValueError, SwarmNodeError) as e:
            return Check("task data", "fail", f"{name}: {e}", "fix task.data (a directory with train.jsonl/test.jsonl)")
        sizes = ", ".join(f"{s} {len(task.split(s))}" for s in task.split_names if _has_split(task, s))
        loaded.append(f"{name} ({sizes})")
    return Check("task data", "ok", "; ".join(loaded))


def _has_split(task, split: str) -> bool:
    try:
        task.split(split)
        return True
    except ValueError:
        return False


def _disk_check(cfg, dims: ModelDims | None) -> Check:
    from swarm_node.train.checkpoint import KEEP

    out = Path(cfg.out).expanduser().resolve()
    existing = next(p for p in [out, *out.parents] if p.exists())
    free = shutil.disk_usage(existing).free
    if dims is None:
        return Check("disk", "ok" if free > 2**30 else "warn", f"{fmt_bytes(free)} free at {existing} "
                     "(model size unknown)")
    checkpoint = 3 * trainable_params(cfg, dims) * 4  # fp32 weights (full) or adapter (LoRA) + AdamW's two states
    need = (KEEP + 1) * checkpoint  # KEEP complete checkpoints and one being written
    detail = (f"{fmt_bytes(free)} free at {existing}; checkpoints need ~{fmt_bytes(need)} "
              f"({KEEP} kept + 1 being written, {fmt_bytes(checkpoint)} each)")
    if free >= 2 * need:
        return Check("disk", "ok", detail)
    return Check("disk", "warn" if free >= need else "fail", detail,
                 "free space, or point --out at a larger disk (checkpoints are written atomically, so a full disk "
                 "loses no data but stops checkpointing)")


def smoke_rounds(device: str, out: str) -> list[dict]:
    """Two training rounds of the tiny preset on `device`, alone, end to end (the `--gpu-smoke` run)."""
    from swarm_node.config import load_config
    from swarm_node.node import run

    cfg = load_config(None, [f"model.device={device}", "model.name=tiny-s", "task.name=arith", "train.rounds=2",
                             "rollout.group_size=4", "rollout.max_new_tokens=8", "task.eval_limit=8", "train.warmstart_steps=0",
                             f"out={out}"])
    return run(cfg)


def _smoke_check(gpu_smoke: bool) -> Check:
    import torch

    if not gpu_smoke:
        return Check("gpu smoke", "skip", "not requested (--gpu-smoke runs two tiny rounds on the GPU)")
    if not torch.cuda.is_available():
        return Check("gpu smoke", "skip", NO_GPU)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="swarm-node-doctor-") as out:
        try:
            rows = smoke_rounds("cuda", out)
        except Exception as e:  # noqa: BLE001 - this is what the smoke run is for
            return Check("gpu smoke", "fail", f"{type(e).__name__}: {e}", "a bug on the GPU path: report it "
                         "with the output of SWARM_NODE_DEBUG=1 swarm-node doctor --gpu-smoke")
    return Check("gpu smoke", "ok", f"{len(rows)} rounds of tiny-s on the GPU in {time.monotonic() - start:.1f} s")


# ---------------------------------------------------------------------------------------------------
# Output

_SHOWN = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


def render(checks: list[Check], width: int = 110) -> str:
    """The checks as a plain-text table; a remedy follows its row after '->'."""
    name_w = max(len(c.name) for c in checks) + 2
    indent = " " * (name_w + 7)
    lines = [f"{'check':<{name_w}}{'status':<7}detail", "-" * width]
    for c in checks:
        detail = textwrap.wrap(c.detail, width - len(indent)) or [""]
        lines.append(f"{c.name:<{name_w}}{_SHOWN.get(c.status, c.status):<7}{detail[0]}")
        lines += [indent + more for more in detail[1:]]
        if c.remedy:
            lines += textwrap.wrap(f"-> {c.remedy}", width, initial_indent=indent, subsequent_indent=indent + "   ")
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    lines.append("-" * width)
    lines.append(f"{failed} failed, {warned} warnings, {len(checks)} checks")
    return "\n".join(lines)


ModelOpt = Annotated[Optional[str], typer.Option(help="Model: preset, local dir, hub id or short name (Qwen2.5-3B).")]
PeersOpt = Annotated[Optional[list[str]], typer.Option(help="Multiaddr of a swarm member to try (repeatable).")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML config file the node will run.")]
RunIdOpt = Annotated[Optional[str], typer.Option(help="Swarm namespace the peers run.")]
SmokeOpt = Annotated[bool, typer.Option("--gpu-smoke", help="Also run two rounds of tiny-s on the GPU.")]


def doctor_command(model: ModelOpt = None, peers: PeersOpt = None, config: ConfigOpt = None, run_id: RunIdOpt = None,
                   gpu_smoke: SmokeOpt = False):
    """Check this machine before joining: versions, GPU and memory, libp2p, peers, data, disk."""
    checks = run_checks(model, peers or [], str(config) if config else None, gpu_smoke, run_id=run_id)
    typer.echo(render(checks))
    raise typer.Exit(1 if any(c.status == "fail" for c in checks) else 0)

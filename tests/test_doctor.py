"""Tests for swarm_node.commands.doctor: every check runs on this CPU machine (GPU ones report "no GPU"),
with a real libp2p daemon, a real peer on 127.0.0.1, real data, and the typer command."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from swarm_node.commands.doctor import NO_GPU, Check, doctor_command, render, run_checks, smoke_rounds

CHECKS = ["python", "torch", "cuda", "gpu", "bf16", "model", "memory", "libp2p", "peers", "listen address",
          "reachable from outside", "task data", "disk", "gpu smoke"]
GPU_CHECKS = ["cuda", "gpu", "bf16", "gpu smoke"]
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def write_config(path: Path, **sections) -> str:
    path.write_text(yaml.safe_dump({"out": str(path.parent / "out"), **sections}))
    return str(path)


@pytest.mark.slow
def test_every_check_runs_here(tmp_path):
    config = {"task": {"name": "gsm8k", "data": str(DATA / "gsm8k")}} if (DATA / "gsm8k").is_dir() else {}
    checks = run_checks(config_path=write_config(tmp_path / "node.yaml", **config), gpu_smoke=True)
    assert [c.name for c in checks] == CHECKS
    assert all(c.status in ("ok", "warn", "fail", "skip") for c in checks)
    found = by_name(checks)
    if not torch.cuda.is_available():
        for name in GPU_CHECKS:
            assert found[name].status == "skip" and NO_GPU in found[name].detail, found[name]
    for name in ("python", "torch", "model", "memory", "libp2p", "listen address", "task data", "disk"):
        assert found[name].status == "ok", found[name]
    assert found["model"].detail.startswith("tiny-s: built-in preset")
    assert "fp32 everywhere (CPU)" in found["memory"].detail and "needs ~" in found["memory"].detail
    assert found["peers"].status == "skip" and "new swarm" in found["peers"].detail
    assert found["listen address"].detail.startswith("/ip") and "/p2p/" in found["listen address"].detail
    reach = found["reachable from outside"]
    assert reach.status == "warn" and reach.detail.startswith("reachability unknown: no peer to dial back")
    if config:
        assert found["task data"].detail == "gsm8k (train 7473, test 1319)"
    table = render(checks)
    for name in CHECKS:
        assert name in table
    print("\n" + table)


@pytest.mark.slow
def test_peers_that_answer_and_peers_that_do_not(tmp_path):
    from swarm_node.config import SwarmConfig
    from swarm_node.net.hivemind import HivemindTransport

    peer = HivemindTransport(SwarmConfig(run_id="doctor-test", host_maddrs=["/ip4/127.0.0.1/tcp/0"]), "m", "tok")
    peer.start()
    try:
        live = peer.join_addrs()[0]
        dead = "/ip4/127.0.0.1/tcp/9/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
        config = write_config(tmp_path / "node.yaml", swarm={"host_maddrs": ["/ip4/127.0.0.1/tcp/0"]})
        both = by_name(run_checks(peers=[live, dead], config_path=config, run_id="doctor-test", peer_wait_s=8))
        only_live = by_name(run_checks(peers=[live], config_path=config, run_id="doctor-test", peer_wait_s=30))
    finally:
        peer.close()
    assert both["peers"].status == "warn" and "1/2 answered" in both["peers"].detail and dead in both["peers"].detail
    assert "--run-id doctor-test" in both["peers"].remedy
    assert only_live["peers"].status == "ok" and "1/1 answered in run 'doctor-test'" in only_live["peers"].detail
    assert only_live["listen address"].detail.startswith("/ip4/127.0.0.1/")
    reach = only_live["reachable from outside"]  # the live peer dialled our port back
    assert reach.status == "ok" and reach.detail.startswith("reachable at 127.0.0.1:"), reach


@pytest.mark.slow
def test_a_new_user_without_hub_access(tmp_path, monkeypatch, capsys):
    """`swarm-node doctor --model Qwen2.5-3B` for gsm8k with no hub: the two failures say why, exit code 1."""
    import typer
    from huggingface_hub import constants
    from typer.testing import CliRunner

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.delenv("SWARM_NODE_DATA", raising=False)
    app = typer.Typer()
    app.command("doctor")(doctor_command)
    config = write_config(tmp_path / "node.yaml", task={"name": "gsm8k"}, swarm={"host_maddrs": ["/ip4/127.0.0.1/tcp/0"]})
    result = CliRunner().invoke(app, ["--model", "Qwen2.5-3B", "--config", config, "--peers", "/ip4/1.2.3.4/tcp/1"])
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())  # the table wraps long details
    assert ("cannot load model 'Qwen2.5-3B' (resolved to hub id 'Qwen/Qwen2.5-3B'): HF_HUB_OFFLINE is set and the "
            "model is not in the local Hugging Face cache") in out
    assert "gsm8k: its data comes from the hub, which is not reachable (HF_HUB_OFFLINE is set)" in out
    assert "bad initial peer '/ip4/1.2.3.4/tcp/1'" in out  # a multiaddr without /p2p/<id>
    assert "memory" in out and "GiB" in out  # Qwen2.5-3B's size is known without the hub
    for name in CHECKS:
        assert name in out


def test_config_and_model_name_errors(tmp_path):
    checks = run_checks(config_path=str(tmp_path / "missing.yaml"))
    assert checks[-1].name == "config" and checks[-1].status == "fail" and "missing.yaml" in checks[-1].detail
    assert [c.name for c in checks[:-1]] == CHECKS[:5]  # the machine is still checked


def test_render_table():
    table = render([Check("python", "ok", "3.11"), Check("peers", "fail", "0/1 answered", "check the address"),
                    Check("gpu", "skip", NO_GPU), Check("reachable from outside", "warn", "reachability unknown")])
    lines = table.splitlines()
    assert lines[0].split() == ["check", "status", "detail"]
    assert any(line.startswith("peers") and "FAIL" in line for line in lines)
    assert any(line.strip() == "-> check the address" for line in lines)
    assert lines[-1] == "1 failed, 1 warnings, 4 checks"


@pytest.mark.slow
def test_smoke_rounds_run_end_to_end_on_cpu(tmp_path):
    """The code `--gpu-smoke` runs on CUDA, run here on CPU so it is known to work."""
    rows = smoke_rounds("cpu", str(tmp_path / "smoke"))
    assert [row["round"] for row in rows] == [0, 1, 2]
    assert all("reward/mean" in row for row in rows[1:])


def test_missing_network_package_is_one_clear_failure(tmp_path, monkeypatch):
    """A GPU image without hivemind (seen on the lent H200): libp2p fails with the install command, nothing else."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hivemind" else real(name, *a))
    found = by_name(run_checks(config_path=write_config(tmp_path / "node.yaml")))
    assert [c.name for c in found.values()] == CHECKS
    assert found["libp2p"].status == "fail" and "hivemind" in found["libp2p"].detail
    assert "pip install" in found["libp2p"].remedy
    assert all(found[n].status == "skip" for n in ("peers", "listen address", "reachable from outside"))
    assert found["model"].status == "ok" and found["task data"].status == "ok"

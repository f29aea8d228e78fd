"""docker/: no Docker engine here, so check what can be checked without one.

- every compose service's command is a valid `swarm-node` invocation: it is run through the
  real CLI (argument parsing and config validation) with the node loop stubbed out;
- the compose wiring (volumes for identities and outputs, the first node's address handed to
  the others, health check, stop signal) and the Dockerfile's build argument;
- docker/entrypoint.sh, with a stand-in `swarm-node` on PATH.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from swarm_node import cli

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
PEER = "/ip4/172.18.0.2/tcp/31337/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"


def service_argv(service: dict) -> list[str]:
    """What the container runs after the entry point's helpers: swarm-node <command> [--peers ADDR]."""
    argv = list(service["command"])
    if "SWARM_NODE_PEERS_FILE" in service.get("environment", {}):
        argv += ["--peers", PEER]
    return argv


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_command_is_a_valid_swarm_node_invocation(name, monkeypatch):
    assert SERVICES[name]["command"][0] in ("join", "train")
    seen = {}

    class FakeExchange:
        def __init__(self, cfg):
            seen["exchange"] = cfg

    def fake_run(cfg, resume=False, exchange=None, **_):
        seen["cfg"], seen["exchange_obj"] = cfg, exchange

    monkeypatch.setattr("swarm_node.node.run", fake_run)
    monkeypatch.setattr("swarm_node.exchange.Exchange", FakeExchange)
    monkeypatch.setattr(cli, "setup_logging", lambda out, verbose: None)  # would create /data/runs/...
    monkeypatch.chdir(ROOT)  # the image's WORKDIR /app holds configs/ like the repository root
    result = CliRunner().invoke(cli.app, service_argv(SERVICES[name]))
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert cfg.swarm.enabled and cfg.swarm.run_id == "compose-swarm"
    assert cfg.swarm.identity.startswith("/data/identity/") and cfg.out.startswith("/data/runs/")
    assert cfg.swarm.host_maddrs == ["/ip4/0.0.0.0/tcp/31337"]
    assert cfg.swarm.peers == ([PEER] if "SWARM_NODE_PEERS_FILE" in SERVICES[name]["environment"] else [])


def test_compose_help_of_every_subcommand_parses():
    for name, service in SERVICES.items():
        result = CliRunner().invoke(cli.app, [service["command"][0], "--help"])
        assert result.exit_code == 0, (name, result.output)


def test_compose_wiring():
    assert len(SERVICES) == 3
    starters = [n for n, s in SERVICES.items() if "SWARM_NODE_ADDR_FILE" in s["environment"]]
    joiners = [n for n, s in SERVICES.items() if "SWARM_NODE_PEERS_FILE" in s["environment"]]
    assert len(starters) == 1 and len(joiners) == 2
    first = SERVICES[starters[0]]
    address_file = first["environment"]["SWARM_NODE_ADDR_FILE"]
    assert address_file in " ".join(first["healthcheck"]["test"])
    configs, outs, identities = set(), set(), set()
    for name in joiners:
        s = SERVICES[name]
        assert s["environment"]["SWARM_NODE_PEERS_FILE"] == address_file
        assert s["depends_on"][starters[0]]["condition"] == "service_healthy"
    for name, s in SERVICES.items():
        argv = s["command"]
        configs.add(argv[argv.index("--config") + 1])
        outs.add(argv[argv.index("--out") + 1])
        identity = argv[argv.index("--identity") + 1]
        identities.add((identity, next(v for v in s["volumes"] if v.endswith(":/data/identity"))))
        mounts = {v.split(":")[1] for v in s["volumes"]}
        assert {"/data/identity", "/data/runs", "/data/cache", "/data/shared"} <= mounts
        assert s["stop_signal"] == "SIGINT"
        assert s["image"].startswith("swarm-node:") and s["build"]["dockerfile"] == "docker/Dockerfile"
        assert (ROOT / argv[argv.index("--config") + 1]).is_file()
    assert len(configs) == len(outs) == 3
    assert len({volume for _, volume in identities}) == 3  # every node its own identity volume
    for volume in {v.split(":")[0] for s in SERVICES.values() for v in s["volumes"]}:
        assert volume in COMPOSE["volumes"]


def test_dockerfile_cpu_build_arg_and_entrypoint():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG TARGET=gpu$", text, re.M)
    assert re.search(r"^FROM nvidia/cuda:\S+ AS base-gpu$", text, re.M)
    assert re.search(r"^FROM \S+ AS base-cpu$", text, re.M)
    assert re.search(r"^FROM base-\$\{TARGET\}$", text, re.M)
    assert "--build-arg TARGET=cpu" in text  # documented
    assert "download.pytorch.org/whl/cpu" in text
    assert 'ENTRYPOINT ["tini", "--", "swarm-node-entrypoint"]' in text and "STOPSIGNAL SIGINT" in text
    for src in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / src).exists(), src
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and "runs" in ignore and ".git" in ignore


FAKE = """\
#!{python}
import os, sys, time
with open(os.environ["FAKE_ARGS"], "w") as f:
    f.write("\\n".join(sys.argv[1:]))
print("some log line", flush=True)
print("Others join this swarm with:  --peers /ip4/10.0.0.2/tcp/31337/p2p/QmTest", flush=True)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


@pytest.fixture
def fake_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "swarm-node"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    return bin_dir


def run_entrypoint(tmp_path, fake_path, env, *args):
    if shutil.which("sh") is None or shutil.which("mkfifo") is None:
        pytest.skip("needs sh and mkfifo")
    full = {**os.environ, "PATH": f"{fake_path}:{os.environ['PATH']}", "FAKE_ARGS": str(tmp_path / "args"), **env}
    proc = subprocess.run(["sh", str(DOCKER / "entrypoint.sh"), *args], env=full, capture_output=True, text=True,
                          timeout=30)
    return proc, (tmp_path / "args").read_text().split("\n")


def test_entrypoint_plain_is_swarm_node(tmp_path, fake_path):
    proc, args = run_entrypoint(tmp_path, fake_path, {"FAKE_EXIT": "3"}, "demo", "--quick")
    assert proc.returncode == 3 and args == ["demo", "--quick"]


def test_entrypoint_publishes_the_first_nodes_address(tmp_path, fake_path):
    addr = tmp_path / "shared" / "first.maddr"
    addr.parent.mkdir()
    addr.write_text("stale\n")
    proc, args = run_entrypoint(tmp_path, fake_path, {"SWARM_NODE_ADDR_FILE": str(addr), "FAKE_EXIT": "0"},
                                "join", "--out", "x")
    assert proc.returncode == 0, proc.stderr
    assert args == ["join", "--out", "x"]
    assert addr.read_text().strip() == "/ip4/10.0.0.2/tcp/31337/p2p/QmTest"
    assert "Others join this swarm with:" in proc.stdout  # the node's output still reaches the log
    proc, _ = run_entrypoint(tmp_path, fake_path, {"SWARM_NODE_ADDR_FILE": str(addr), "FAKE_EXIT": "5"}, "join")
    assert proc.returncode == 5  # the node's exit code survives the pipe


def test_entrypoint_joins_with_the_published_address(tmp_path, fake_path):
    addr = tmp_path / "first.maddr"
    addr.write_text(textwrap.dedent("/ip4/10.0.0.2/tcp/31337/p2p/QmTest\n"))
    proc, args = run_entrypoint(tmp_path, fake_path, {"SWARM_NODE_PEERS_FILE": str(addr)}, "join", "--config", "c.yaml")
    assert proc.returncode == 0, proc.stderr
    assert args == ["join", "--config", "c.yaml", "--peers", "/ip4/10.0.0.2/tcp/31337/p2p/QmTest"]

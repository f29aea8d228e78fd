"""docker/, checked without a container engine (tests/test_compose.py runs the swarm for real):

- every compose service's command is a valid `swarm-node` invocation: it is run through the
  real CLI (argument parsing and config validation) with the node loop stubbed out;
- the compose wiring (volumes for identities and outputs, the first node's address handed to
  the others, health check, stop signal) and the Dockerfile's build arguments;
- docker/entrypoint.sh, with a stand-in `swarm-node` on PATH that writes OUT/status.json;
- docker/local-image.sh's podman command line, with a stand-in podman.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from swarm_node.commands import cli

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

    def fake_run(cfg, resume=False, connect=None, **_):
        seen["cfg"], seen["connect"] = cfg, connect

    monkeypatch.setattr("swarm_node.node.run", fake_run)
    monkeypatch.setattr(cli, "setup_logging", lambda out, verbose: None)  # would create /data/runs/...
    monkeypatch.chdir(ROOT)  # the image's WORKDIR /app holds configs/ like the repository root
    result = CliRunner().invoke(cli.app, service_argv(SERVICES[name]))
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert seen["connect"] is not None and cfg.swarm.run_id == "compose-swarm"  # a swarm node
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
    for joiner in joiners:
        s = SERVICES[joiner]
        assert s["environment"]["SWARM_NODE_PEERS_FILE"] == address_file
        assert s["depends_on"][starters[0]]["condition"] == "service_healthy"
    for s in SERVICES.values():
        argv = s["command"]
        configs.add(argv[argv.index("--config") + 1])
        outs.add(argv[argv.index("--out") + 1])
        identity = argv[argv.index("--identity") + 1]
        identities.add((identity, next(v for v in s["volumes"] if v.endswith(":/data/identity"))))
        mounts = {v.split(":")[1] for v in s["volumes"]}
        assert {"/data/identity", "/data/runs", "/data/cache", "/data/shared"} <= mounts
        assert s["stop_signal"] == "SIGINT"
        assert "SWARM_NODE_ARGS" in s["environment"] and s["environment"]["SWARM_NODE_ARGS"] is None  # from the host
        assert s["image"].startswith("swarm-node:") and s["build"]["dockerfile"] == "docker/Dockerfile"
        assert (ROOT / argv[argv.index("--config") + 1]).is_file()
    assert len(configs) == len(outs) == 3
    assert len({volume for _, volume in identities}) == 3  # every node its own identity volume
    for volume in {v.split(":")[0] for s in SERVICES.values() for v in s["volumes"]}:
        assert volume in COMPOSE["volumes"]


def test_dockerfile_build_args_and_entrypoint():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^ARG TARGET=gpu$", text, re.M)
    assert re.search(r"^ARG CPU_BASE=debian:bookworm-slim$", text, re.M)  # a registry image by default
    assert re.search(r"^FROM nvidia/cuda:\S+ AS base-gpu$", text, re.M)
    assert re.search(r"^FROM \$\{CPU_BASE\} AS base-cpu$", text, re.M)
    assert re.search(r"^FROM base-\$\{TARGET\}$", text, re.M)
    assert "--build-arg TARGET=cpu" in text  # documented
    assert "download.pytorch.org/whl/cpu" in text and "download.pytorch.org/whl/cu124" in text
    for arg in ("TORCH_SPEC=torch", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST",
                "PIP_CERT"):
        assert re.search(rf"^ARG {arg}$", text, re.M), arg
    assert 'pip install "${TORCH_SPEC}" --index-url "${TORCH_INDEX_URL}"' in text
    assert 'ENTRYPOINT ["tini", "--", "swarm-node-entrypoint"]' in text and "STOPSIGNAL SIGINT" in text
    for src in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / src).exists(), src
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and "runs" in ignore and ".git" in ignore


def test_shell_scripts_parse():
    if shutil.which("sh") is None:
        pytest.skip("needs sh")
    for script in ("entrypoint.sh", "local-image.sh"):
        proc = subprocess.run(["sh", "-n", str(DOCKER / script)], capture_output=True, text=True)
        assert proc.returncode == 0, (script, proc.stderr)


FAKE = """\
#!{python}
# Stand-in for swarm-node: records its argv and pid; with FAKE_ADDR and --out, writes
# OUT/status.json after FAKE_DELAY s, as a node does once its transport is up, and runs until
# the entry point has published the address (at most 20 s).
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_ARGS"], "w") as f:
    f.write("\\n".join(args))
with open(os.environ["FAKE_ARGS"] + ".pid", "w") as f:
    f.write(str(os.getpid()))
if "--out" in args and os.environ.get("FAKE_ADDR"):
    out = args[args.index("--out") + 1]
    time.sleep(float(os.environ.get("FAKE_DELAY", "0")))
    status = {{"state": "running", "pid": os.getpid(), "updated_at": time.time(),
              "join_addrs": [os.environ["FAKE_ADDR"], "/ip4/127.0.0.1/tcp/31337/p2p/QmTest"]}}
    with open(out + "/status.json.tmp", "w") as f:
        json.dump(status, f)
    os.replace(out + "/status.json.tmp", out + "/status.json")
    deadline = time.time() + 20
    while not os.path.exists(os.environ.get("SWARM_NODE_ADDR_FILE", "/nonexistent")) and time.time() < deadline:
        time.sleep(0.05)
print("some log line", flush=True)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""
ADDR = "/ip4/10.0.0.2/tcp/31337/p2p/QmTest"


@pytest.fixture
def fake_path(tmp_path):
    if shutil.which("sh") is None or shutil.which("python3") is None:
        pytest.skip("needs sh and python3")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "swarm-node"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    return bin_dir


def run_entrypoint(tmp_path, fake_path, env, *args):
    """Runs docker/entrypoint.sh; returns (process, the argv and pid the stand-in node got)."""
    full = {**os.environ, "PATH": f"{fake_path}:{os.environ['PATH']}", "FAKE_ARGS": str(tmp_path / "args"), **env}
    # Files, not pipes: a publisher still polling must not hold the test's pipes open.
    with open(tmp_path / "stdout", "w+") as stdout, open(tmp_path / "stderr", "w+") as stderr:
        popen = subprocess.Popen(["sh", str(DOCKER / "entrypoint.sh"), *args], env=full, stdout=stdout, stderr=stderr,
                                 text=True)
        popen.wait(timeout=60)
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, (tmp_path / "stdout").read_text(),
                                       (tmp_path / "stderr").read_text())
    proc.pid = popen.pid
    return proc, (tmp_path / "args").read_text().split("\n"), int((tmp_path / "args.pid").read_text())


def leftover_processes(marker: str) -> list[str]:
    """Command lines of running processes that mention `marker` (e.g. a test's tmp dir)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in text:
            found.append(text)
    return found


def test_entrypoint_plain_execs_swarm_node(tmp_path, fake_path):
    proc, args, pid = run_entrypoint(tmp_path, fake_path, {"FAKE_EXIT": "3"}, "demo", "--quick")
    assert proc.returncode == 3 and args == ["demo", "--quick"]
    assert pid == proc.pid  # exec'd: the node itself gets docker stop's SIGINT


def test_entrypoint_publishes_the_first_nodes_address_from_status_json(tmp_path, fake_path):
    out, addr = tmp_path / "out", tmp_path / "shared" / "first.maddr"
    out.mkdir()
    addr.parent.mkdir()
    addr.write_text("stale\n")  # from an earlier run, like the status below: neither may be used
    (out / "status.json").write_text(json.dumps({"state": "finished", "updated_at": 1000.0,
                                                 "join_addrs": ["/ip4/10.0.0.9/tcp/1/p2p/QmOld"]}))
    env = {"SWARM_NODE_ADDR_FILE": str(addr), "FAKE_ADDR": ADDR, "FAKE_DELAY": "1.5", "FAKE_EXIT": "5"}
    proc, args, pid = run_entrypoint(tmp_path, fake_path, env, "join", "--out", str(out))
    assert proc.returncode == 5, proc.stderr  # the node's exit code is the container's
    assert args == ["join", "--out", str(out)] and pid == proc.pid
    assert addr.read_text() == ADDR + "\n"  # the first (non-loopback) join address of this run
    assert "some log line" in proc.stdout and f"publishing {ADDR}" in proc.stderr


def test_entrypoint_without_out_cannot_publish(tmp_path, fake_path):
    env = {"SWARM_NODE_ADDR_FILE": str(tmp_path / "a.maddr")}
    proc = subprocess.run(["sh", str(DOCKER / "entrypoint.sh"), "join"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "needs --out" in proc.stderr


def test_entrypoint_publisher_ends_with_a_node_that_never_came_up(tmp_path, fake_path):
    out, addr = tmp_path / "out", tmp_path / "first.maddr"
    out.mkdir()
    proc, _, _ = run_entrypoint(tmp_path, fake_path, {"SWARM_NODE_ADDR_FILE": str(addr), "FAKE_EXIT": "1"},
                                "join", "--out", str(out))
    assert proc.returncode == 1 and not addr.exists()
    deadline = time.monotonic() + 10  # the publisher polls once a second
    while leftover_processes(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftover_processes(str(out)) == []


def test_entrypoint_joins_with_the_published_address_and_extra_args(tmp_path, fake_path):
    addr = tmp_path / "first.maddr"
    addr.write_text(ADDR + "\n")
    env = {"SWARM_NODE_PEERS_FILE": str(addr), "SWARM_NODE_ARGS": " --rounds 4  --set task.options=* "}
    (tmp_path / "glob-bait").touch()  # `*` must stay `*`, never expand to file names
    proc, args, _ = run_entrypoint(tmp_path, fake_path, env, "join", "--config", "c.yaml")
    assert proc.returncode == 0, proc.stderr
    assert args == ["join", "--config", "c.yaml", "--rounds", "4", "--set", "task.options=*", "--peers", ADDR]


FAKE_PODMAN = """\
#!/bin/sh
# Stand-in podman: `image exists` answers FAKE_IMAGE_EXISTS, `build` is recorded, the rest succeeds.
if [ "$1 $2" = "image exists" ]; then exit "$FAKE_IMAGE_EXISTS"; fi
if [ "$1" = build ]; then printf '%s\\n' "$@" > "$FAKE_PODMAN_ARGS"; fi
"""


def test_local_image_build_command(tmp_path):
    if shutil.which("sh") is None:
        pytest.skip("needs sh")
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    wheels, cert = tmp_path / "wheels", tmp_path / "ca.pem"
    wheels.mkdir()
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    wheel = wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    env = {**os.environ, "PODMAN": str(podman), "FAKE_IMAGE_EXISTS": "0", "FAKE_PODMAN_ARGS": str(tmp_path / "args"),
           "TORCH_WHEEL": str(wheel), "PIP_CERT": str(cert), "PIP_INDEX_URL": "https://mirror.example/simple",
           "PIP_EXTRA_INDEX_URL": ""}
    proc = subprocess.run(["sh", str(DOCKER / "local-image.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "base image localhost/swarm-node-base:bookworm exists" in proc.stderr  # no debootstrap when cached
    argv = (tmp_path / "args").read_text().splitlines()
    pairs = {(argv[i], argv[i + 1]) for i in range(len(argv) - 1)}
    assert argv[0] == "build" and argv[-1] == str(ROOT) and ("-t", "swarm-node:cpu") in pairs
    assert ("-f", str(DOCKER / "Dockerfile")) in pairs
    assert ("--ignorefile", str(DOCKER / "Dockerfile.dockerignore")) in pairs
    for arg in ("TARGET=cpu", "CPU_BASE=localhost/swarm-node-base:bookworm", "PIP_FIND_LINKS=/wheels",
                "TORCH_SPEC=torch==2.13.0+cpu", "TORCH_INDEX_URL=https://mirror.example/simple",
                "PIP_INDEX_URL=https://mirror.example/simple", "PIP_CERT=/etc/swarm-node-build-ca.pem"):
        assert ("--build-arg", arg) in pairs, arg
    assert not any(a.startswith("PIP_EXTRA_INDEX_URL") for a in argv)  # empty: not passed
    assert ("--volume", f"{wheels}:/wheels:ro") in pairs
    assert ("--volume", f"{cert}:/etc/swarm-node-build-ca.pem:ro") in pairs


def test_local_image_says_when_the_base_cannot_be_built(tmp_path):
    if shutil.which("sh") is None:
        pytest.skip("needs sh")
    podman = tmp_path / "podman"
    podman.write_text(FAKE_PODMAN)
    podman.chmod(0o755)
    env = {**os.environ, "PODMAN": str(podman), "FAKE_IMAGE_EXISTS": "1", "FAKE_PODMAN_ARGS": str(tmp_path / "args"),
           "PATH": "/nonexistent-bin:/usr/bin:/bin"}
    if shutil.which("debootstrap", path=env["PATH"]) and os.geteuid() == 0:
        env["PATH"] = "/bin"  # hide debootstrap (in /usr/sbin) so the "cannot" branch runs
        if shutil.which("debootstrap", path=env["PATH"]):
            pytest.skip("cannot hide debootstrap here")
    proc = subprocess.run(["sh", str(DOCKER / "local-image.sh"), "--base-only"], env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 3 and "needs root and debootstrap" in proc.stderr
    assert not (tmp_path / "args").exists()  # nothing imported or built

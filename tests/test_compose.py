"""docker/docker-compose.yml run for real, with podman and podman-compose.

docker/local-image.sh builds the CPU image from the working tree (its Debian base once per
machine with debootstrap, then podman's layer cache: seconds after a source change), with the
host's pip settings (index, CA bundle, a local CPU torch wheel). `podman-compose up -d` starts the
three services; the test waits until every node has accepted peers' packets in a few rounds
(`swarm/packets_accepted` in the metrics.jsonl on the `runs` volume), stops them like `down` does
(SIGINT) and checks they exited on their own, then removes containers, volumes and network.
Skipped, with the reason, where podman cannot run containers (a failure under CI: `make test`
installs podman with tests/host-packages.sh); a failing build fails.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarm_node.metrics import read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
NODES = ("tiny-s", "tiny-m", "tiny-s-lora")
# Appended to every service's command (docker/entrypoint.sh): a tiny warm start, a small eval, and
# more rounds than the test waits for, so the nodes are still training when they are stopped.
NODE_ARGS = "--rounds 500 --set train.warmstart_steps=20 --set task.eval_limit=20 --set train.eval_every=0"
ROUNDS_WITH_PEERS = 2  # rounds with accepted peer packets every node must reach
BUILD_TIMEOUT_S = 1800  # first build here: debootstrap ~70 s, then ~5 min of pip; cached: ~15 s
EXCHANGE_TIMEOUT_S = 300  # measured: ~60 s from `up` to every node having traded packets
STOP_TIMEOUT_S = 10  # podman-compose stop's grace period before SIGKILL (exit code 137)


def podman_env() -> dict[str, str]:
    """The environment for podman, podman-compose and docker/local-image.sh: the host's pip
    settings as PIP_* variables, and docker/podman-containers.conf unless CONTAINERS_CONF is set."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.setdefault("CONTAINERS_CONF", str(DOCKER / "podman-containers.conf"))
    for key, value in pip_config().items():
        env.setdefault(key, value)
    return env


def pip_config() -> dict[str, str]:
    """pip's configured index, extra index, trusted host and CA bundle as PIP_* variables
    (file:// indexes are left out: the build container cannot see them)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    found = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        value = value.strip().strip("'\"")
        if name == "cert" and Path(value).is_file():
            found["PIP_CERT"] = value
        elif name in ("index-url", "extra-index-url", "trusted-host"):
            kept = [v for v in value.split() if not v.startswith("file:")]
            if kept:
                found["PIP_" + name.replace("-", "_").upper()] = " ".join(kept)
    return found


def torch_wheel() -> str | None:
    """A CPU torch wheel for the image's Python 3.11 in pip's find-links dirs (PIP_FIND_LINKS or
    pip config), preferring the host's torch version; None: the build uses download.pytorch.org."""
    import torch

    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    dirs = os.environ.get("PIP_FIND_LINKS", "").split()
    dirs += [v for line in proc.stdout.splitlines() if ".find-links=" in line
             for v in line.split("=", 1)[1].strip("'\"").split()]
    pattern = "torch-*+cpu-cp311-cp311-*x86_64.whl"
    wheels = sorted({w for d in dirs for w in Path(d.removeprefix("file://")).glob(pattern)})
    mine = [w for w in wheels if w.name.startswith(f"torch-{torch.__version__}-")]
    return str((mine or wheels)[-1]) if wheels else None


def engine_problem(env: dict[str, str]) -> str | None:
    """Why podman cannot run the compose swarm here (None: it can)."""
    for tool in ("podman", "podman-compose"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed; install with: sh tests/host-packages.sh (as root; `make test` runs it)"
    proc = subprocess.run(["podman", "info"], env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return f"podman cannot run here: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def build_image(env: dict[str, str]) -> None:
    wheel = torch_wheel()
    build_env = {**env, **({"TORCH_WHEEL": wheel} if wheel else {})}
    t = time.monotonic()
    proc = run(["sh", str(DOCKER / "local-image.sh")], build_env, BUILD_TIMEOUT_S)
    if proc.returncode == 3:  # this host cannot make the base image (no root or no debootstrap)
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, f"image build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"image built in {time.monotonic() - t:.0f} s (torch wheel: {wheel})")


def containers(project: str, env: dict[str, str]) -> dict[str, dict]:
    """service name -> `podman inspect` of its container, for the compose project."""
    ids = run(["podman", "ps", "-aq", "--filter", f"label=io.podman.compose.project={project}"], env, 60).stdout.split()
    if not ids:
        return {}
    info = json.loads(run(["podman", "inspect", *ids], env, 60).stdout)
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in info}


def logs(project: str, env: dict[str, str]) -> str:
    parts = []
    for service, c in containers(project, env).items():
        proc = run(["podman", "logs", "--tail", "25", c["Id"]], env, 60)
        parts.append(f"--- {service} ({c['State']['Status']}, exit {c['State']['ExitCode']}):\n"
                     f"{proc.stdout}{proc.stderr}")
    return "\n".join(parts)


def volume_dir(project: str, volume: str, env: dict[str, str]) -> Path:
    proc = run(["podman", "volume", "inspect", f"{project}_{volume}", "--format", "{{.Mountpoint}}"], env, 60)
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


def rounds_with_peer_packets(runs: Path) -> dict[str, int]:
    """node -> rounds whose metrics row has accepted peer packets (so far)."""
    counts = {}
    for node in NODES:
        path = runs / node / "metrics.jsonl"
        rows = read_metrics(path) if path.exists() else []
        counts[node] = sum(1 for row in rows if (row.get("swarm/packets_accepted") or 0) > 0)
    return counts


def wait_for_exchange(project: str, runs: Path, env: dict[str, str]) -> dict[str, int]:
    deadline, counts = time.monotonic() + EXCHANGE_TIMEOUT_S, {}
    while time.monotonic() < deadline:
        counts = rounds_with_peer_packets(runs)
        if min(counts.values()) >= ROUNDS_WITH_PEERS:
            return counts
        running = {s: c["State"]["Running"] for s, c in containers(project, env).items()}
        assert all(running.get(n) for n in NODES), f"a node stopped early {running}:\n{logs(project, env)}"
        time.sleep(3)
    pytest.fail(f"no packet exchange within {EXCHANGE_TIMEOUT_S} s: {counts}\n{logs(project, env)}")


def test_compose_swarm_trains_together_and_stops_cleanly():
    env = podman_env()
    problem = engine_problem(env)
    if problem:
        pytest.skip(problem)
    build_image(env)
    project = f"swarmnodetest{os.getpid()}"
    compose = ["podman-compose", "-p", project, "-f", str(DOCKER / "docker-compose.yml")]
    try:
        t = time.monotonic()
        proc = run([*compose, "up", "-d"], {**env, "SWARM_NODE_ARGS": NODE_ARGS}, 600)
        assert proc.returncode == 0 and len(containers(project, env)) == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs = volume_dir(project, "runs", env)
        counts = wait_for_exchange(project, runs, env)
        print(f"every node traded packets {counts} after {time.monotonic() - t:.0f} s")

        t = time.monotonic()
        proc = run([*compose, "stop"], env, 3 * STOP_TIMEOUT_S + 60)  # SIGINT (stop_signal), then SIGKILL
        stopped_s = time.monotonic() - t
        assert proc.returncode == 0, proc.stderr[-3000:]
        states = {s: c["State"] for s, c in containers(project, env).items()}
        print(f"stopped in {stopped_s:.1f} s, exit codes {[(s, st['ExitCode']) for s, st in states.items()]}")
        for node in NODES:
            # 0 or 130 (SIGINT, handled like Ctrl-C); 137 would be SIGKILL after the grace period
            assert not states[node]["Running"] and states[node]["ExitCode"] in (0, 130), (node, states[node])
            status = json.loads((runs / node / "status.json").read_text())
            assert status["peer_id"] and status["round"] >= ROUNDS_WITH_PEERS, status
            # until the node reports a stop as its own state, a Ctrl-C shows as KeyboardInterrupt
            assert status["state"] in ("stopped", "finished") or (status["error"] or "").startswith(
                "KeyboardInterrupt"), status
            assert (runs / node / "config.yaml").is_file() and (runs / node / "node.log").is_file()
        first = (volume_dir(project, "shared", env) / "first-node.maddr").read_text().strip()
        tiny_s = json.loads((runs / "tiny-s" / "status.json").read_text())
        assert first == tiny_s["join_addrs"][0] and first.endswith("/p2p/" + tiny_s["peer_id"])
    finally:
        run([*compose, "down", "-v"], env, 3 * STOP_TIMEOUT_S + 120)
        run(["podman", "network", "rm", f"{project}_default"], env, 60)  # podman-compose 1.0 leaves it
    assert containers(project, env) == {}
    left = run(["podman", "volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}"], env, 60)
    assert left.stdout.split() == []

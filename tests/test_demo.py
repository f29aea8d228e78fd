"""`swarm-node demo`: node specs and command lines, the live view's tailing, waiting for a node's
status, stopping processes, the warm-start cache, and (slow) a real reduced demo and a Ctrl-C in
the middle of one.

The slow tests start real node processes (3 x `swarm-node join` with their p2pd daemons) on
127.0.0.1; the Ctrl-C test checks with psutil that no node process and no p2pd survives.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console
from typer.testing import CliRunner

from swarm_node.commands import cli
from swarm_node.commands.demo import run as demo
from swarm_node.commands.demo.live import NodeView
from swarm_node.commands.demo.run import DemoError, wait_until_up
from swarm_node.config import ConfigError
from swarm_node.harness.process import CHILD_ENV, NodeFailed, NodeProcess, stop_processes
from swarm_node.harness.warmstart import group_by_recipe, warm_start
from swarm_node.status import StatusFile, read_status

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIGS = ROOT / "configs" / "demo"
SMALL = ["--warmstart-steps", "20", "--eval-limit", "20", "--eval-every", "0"]


# ---- fast ----------------------------------------------------------------------------------------
def test_overrides_quick_then_flags_then_sets():
    assert demo.demo_overrides() == []
    over = demo.demo_overrides(rounds=7, quick=True, sets=["train.lr=1e-4"])
    assert over[-1] == "train.lr=1e-4" and "train.rounds=7" in over and "train.rounds=3" not in over
    specs = demo.load_specs(DEMO_CONFIGS, over)
    assert [s.cfg.train.rounds for s in specs] == [7, 7, 7]
    assert {s.cfg.train.lr for s in specs} == {1e-4} and {s.cfg.task.eval_limit for s in specs} == {20}


def test_demo_nodes_are_heterogeneous_and_distinct():
    specs = demo.load_specs(DEMO_CONFIGS, [])
    assert [s.name for s in specs] == ["tiny-s", "tiny-m", "tiny-s-lora"]
    assert len({s.cfg.model.name for s in specs}) == 2 and [s.cfg.model.lora_r > 0 for s in specs] == [0, 0, 1]
    assert len({s.cfg.train.seed for s in specs}) == 3


def test_duplicate_node_names_are_refused(tmp_path):
    for i in range(2):
        (tmp_path / f"{i}.yaml").write_text("name: same\n")
    with pytest.raises(ConfigError, match="names must differ"):
        demo.load_specs(tmp_path, [])
    with pytest.raises(FileNotFoundError):
        demo.load_specs(tmp_path / "empty", [])


@pytest.mark.parametrize("kind", list(demo.KINDS))
def test_node_command_lines_are_valid_cli_invocations(kind, tmp_path, monkeypatch):
    """The exact argv the demo runs parses and validates through the real CLI (node loop stubbed)."""
    command, variant = demo.KINDS[kind]
    spec = demo.load_specs(DEMO_CONFIGS, demo.demo_overrides(rounds=5, quick=True))[1]
    peers = "/ip4/127.0.0.1/tcp/4001/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"
    argv = demo.node_argv(spec, command, tmp_path / "n", "demo-x", variant, peers)
    assert argv[:3] == [sys.executable, "-m", "swarm_node"]
    seen = {}

    def fake_run(cfg, resume=False, connect=None, on_round=None):  # swarm_node.node.run's signature
        seen.update(cfg=cfg, connect=connect)

    monkeypatch.setattr("swarm_node.node.run", fake_run)
    monkeypatch.setattr("swarm_node.swarm.exchange.Exchange", lambda *args, **kwargs: None)
    monkeypatch.setattr(cli, "setup_logging", lambda out, verbose: None)
    result = CliRunner().invoke(cli.app, argv[3:])
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert cfg.name == "tiny-m" and cfg.train.rounds == 5 and cfg.out == str(tmp_path / "n")
    assert cfg.loss.variant == (variant or "f-tis")
    assert argv[3] == command
    if command == "join":  # a swarm node: it connects to a transport, bootstrapping from the given peer
        assert seen["connect"] is not None
        assert cfg.swarm.peers == [peers] and cfg.swarm.run_id == "demo-x"
        assert cfg.swarm.host_maddrs == ["/ip4/127.0.0.1/tcp/0"]
    else:  # alone: no transport, no peers, no swarm flags on its command line
        assert seen["connect"] is None
        assert cfg.swarm.peers == [] and not {"--peers", "--identity", "--run-id", "--host-maddrs"} & set(argv)


def test_node_view_tails_metrics_across_partial_writes(tmp_path):
    view = NodeView("a", "", tmp_path, rounds=10)
    assert view.poll() == [] and view.round == -1 and view.params == ""
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"round": 0, "eval/accuracy": 0.2, "eval/n": 20}) + "\n" + '{"round": 1, "rew')
    assert [r["round"] for r in view.poll()] == [0] and view.status == "running"
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('ard/mean": 0.5, "swarm/peers": 2}\n')
    assert view.poll()[0]["reward/mean"] == 0.5
    assert (view.round, view.start_acc, view.last("swarm/peers")) == (1, 0.2, 2)
    status = StatusFile(tmp_path, "a", rounds=10)  # what the node writes, in the node's own format
    view.poll()
    assert view.params == ""  # the model is not loaded yet
    status.update(model="tiny-s", params=110_592, trainable_params=110_592)
    view.poll()
    assert view.params == "0.11M params"


def test_the_demo_reads_only_metric_keys_the_node_writes():
    from swarm_node import metrics
    from swarm_node.commands.demo import live, plots
    from swarm_node.train.loss import STAT_KEYS

    written = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str)} | set(STAT_KEYS)
    assert set(live.METRIC_KEYS) <= written and set(plots.METRIC_KEYS) <= written
    assert {live.DROPPED_FRAC, live.TRUNCATED_FRAC, plots.DROPPED_FRAC} <= set(STAT_KEYS)


def test_nodes_sharing_a_warm_start_recipe_share_one_phase():
    specs = demo.load_specs(DEMO_CONFIGS, [])
    groups = group_by_recipe(specs)
    assert [[s.name for s in g] for g in groups] == [["tiny-s", "tiny-s-lora"], ["tiny-m"]]
    assert group_by_recipe(demo.load_specs(DEMO_CONFIGS, ["train.warmstart_steps=0"])) == []


# A stand-in node: writes OUT/status.json the way the node does (StatusFile), then behaves per argv.
FAKE_NODE = """
import pathlib, sys, time
from swarm_node.status import StatusFile
out, mode = sys.argv[1], sys.argv[2]
pathlib.Path(out).mkdir(exist_ok=True)
status = StatusFile(out, "fake", rounds=3)
time.sleep(0.5)
if mode == "fail":
    print("error: cannot load model /nonexistent", flush=True)
    sys.exit(2)
status.update(model="tiny-s", params=1000)
time.sleep(0.5)
if mode == "up":
    status.update(peer_id="QmFake", join_addrs=["/ip4/127.0.0.1/tcp/4242/p2p/QmFake", "/ip4/10.0.0.1/tcp/4242/p2p/QmFake"])
time.sleep(60)
"""


def _fake_node(tmp_path: Path, mode: str) -> NodeProcess:
    out = tmp_path / mode
    return NodeProcess([sys.executable, "-c", FAKE_NODE, str(out), mode], out).start()


def test_wait_until_up_reads_the_join_address_from_status_json(tmp_path):
    up, ticks = _fake_node(tmp_path, "up"), []
    try:
        status = wait_until_up(up, timeout=60, tick=lambda: ticks.append(1))
        assert status["join_addrs"][0] == "/ip4/127.0.0.1/tcp/4242/p2p/QmFake" and status["params"] == 1000
        assert status["pid"] == up.popen.pid and ticks  # the live view kept refreshing meanwhile
    finally:
        stop_processes([up], grace_int=1.0, grace_term=1.0)


def test_wait_until_up_ignores_a_stale_status_and_reports_a_failed_node(tmp_path):
    (tmp_path / "silent").mkdir()  # an earlier process's status, with an address, in the same directory
    StatusFile(tmp_path / "silent", "old", rounds=3).update(join_addrs=["/ip4/127.0.0.1/tcp/1/p2p/QmOld"], params=1)
    assert read_status(tmp_path / "silent")["join_addrs"]
    silent, failing = _fake_node(tmp_path, "silent"), _fake_node(tmp_path, "fail")
    try:
        with pytest.raises(DemoError, match="did not start its swarm within 5 s"):
            wait_until_up(silent, timeout=5)
        with pytest.raises(DemoError, match=r"exited \(code 2\) before its swarm started") as failed:
            wait_until_up(failing, timeout=60)
        assert "error: cannot load model /nonexistent" in str(failed.value)  # the node's own words, from console.log
    finally:
        stop_processes([silent, failing], grace_int=1.0, grace_term=1.0)


def test_node_process_learns_the_join_address_from_status_json(tmp_path, procs):
    """`NodeProcess.address()` (used by the join and reliability tests and the benchmarks) reads status.json."""
    out = tmp_path / "p"
    out.mkdir()
    StatusFile(out, "old", rounds=3).update(join_addrs=["/ip4/127.0.0.1/tcp/1/p2p/QmOld"])  # a stale one: ignored
    assert read_status(out)["join_addrs"]
    node = procs(NodeProcess([sys.executable, "-c", FAKE_NODE, str(out), "up"], out))
    assert node.address() == "/ip4/127.0.0.1/tcp/4242/p2p/QmFake"
    failing = procs(NodeProcess([sys.executable, "-c", FAKE_NODE, str(tmp_path / "f"), "fail"], tmp_path / "f"))
    with pytest.raises(NodeFailed, match=r"exited \(code 2\) before its swarm started") as failed:
        failing.address()
    assert failed.value.exited and "error: cannot load model" in str(failed.value)


STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)     # ignores Ctrl-C ...
signal.signal(signal.SIGTERM, signal.SIG_IGN)    # ... and SIGTERM
child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])  # escapes the group
print(child.pid, flush=True)
time.sleep(600)
"""


def test_stop_processes_escalates_and_kills_escaped_descendants(tmp_path):
    proc = NodeProcess([sys.executable, "-c", STUBBORN]).start()
    child = psutil.Process(int(proc.wait_line("\n", 30)))
    start = time.monotonic()
    stop_processes([proc], grace_int=1.0, grace_term=1.0)
    assert proc.popen.poll() == -signal.SIGKILL and time.monotonic() - start < 15
    child.wait(10)  # it left the process group, but was remembered as a descendant and killed
    assert not child.is_running()


def test_demo_help_and_bad_option():
    runner = CliRunner()
    result = runner.invoke(cli.app, ["demo", "--help"])
    assert result.exit_code == 0 and "--compare" in result.output and "--quick" in result.output
    result = runner.invoke(cli.app, ["demo", "--set", "train.nope=1", "--out", "/nonexistent/x"])
    assert result.exit_code == 2 and "error: unknown config key 'train.nope'" in result.output


def test_demo_refuses_to_mix_into_an_old_run(tmp_path):
    (tmp_path / "tiny-s").mkdir()
    (tmp_path / "tiny-s" / "metrics.jsonl").write_text('{"round": 0}\n')
    result = CliRunner().invoke(cli.app, ["demo", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "already holds a run" in result.output


# ---- slow: real processes ------------------------------------------------------------------------
@pytest.mark.slow
def test_warm_start_is_cached_and_says_so(tmp_path):
    specs = demo.load_specs(DEMO_CONFIGS, ["train.warmstart_steps=3", "train.warmstart_batch=4"])
    outputs = []
    for _ in range(2):
        console = Console(record=True, width=200, force_terminal=False)
        warm_start(specs, console, CHILD_ENV)
        outputs.append(console.export_text())
    assert "2 supervised phase(s)" in outputs[0]  # tiny-s and tiny-s-lora share one warm start
    assert outputs[0].count("saved to") == 2 and "reusing cached" not in outputs[0]
    assert outputs[1].count("reusing cached") == 2 and "saved to" not in outputs[1]


def _demo(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "160"}
    return subprocess.Popen([sys.executable, "-m", "swarm_node", "demo", "--out", str(out), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow
def test_reduced_demo_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = _demo(out, "--rounds", "3", "--eval-every", "3", "--warmstart-steps", "20", "--eval-limit", "20",
                 "--set", "swarm.deadline_s=8")
    try:
        output, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output
    names = ["tiny-s", "tiny-m", "tiny-s-lora"]
    for name in names:
        node = out / name
        rows = [json.loads(line) for line in (node / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows] == [0, 1, 2, 3]
        assert rows[0]["eval/n"] == 20 and "eval/accuracy" in rows[3]
        # a real swarm: every node saw its two peers and trained on their groups (round 1 of the
        # first node may pass before the others are up on a busy machine)
        assert max(r["swarm/peers"] for r in rows[1:]) == 2
        assert sum(r["swarm/peer_groups_used"] for r in rows[1:]) > 0
        assert (node / "node.log").is_file() and (node / "console.log").is_file() and (node / "identity.key").is_file()
    for png in ("accuracy.png", "training.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((out / "summary.json").read_text())
    assert [row["node"] for row in summary] == names
    assert all({"start", "end", "best", "n"} <= set(row) for row in summary)
    assert "| tiny-s-lora |" in (out / "summary.md").read_text()
    assert json.loads((out / "demo.json").read_text())["nodes"] == names
    commands = (out / "commands.txt").read_text().splitlines()
    assert len(commands) == 3 and all(c.startswith("swarm-node join --config ") for c in commands)
    assert "--peers /ip4/127.0.0.1/" not in commands[0] and all("--peers /ip4/127.0.0.1/" in c for c in commands[1:])
    assert "Warm start" in output and "Held-out accuracy" in output and "swarm started by tiny-s" in output


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_stops_every_node_and_p2pd(tmp_path, sig):
    out = tmp_path / "run"
    proc = _demo(out, "--rounds", "1000", *SMALL)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # all three nodes are exchanging packets
            rows = []
            for name in ("tiny-s", "tiny-m", "tiny-s-lora"):
                try:
                    rows.append((out / name / "metrics.jsonl").read_text().count("\n"))
                except OSError:
                    rows.append(0)
            if min(rows) >= 3:
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        else:
            pytest.fail("the demo's nodes did not reach round 2")
        tree = psutil.Process(proc.pid).children(recursive=True)
        nodes = [p for p in tree if "join" in " ".join(p.cmdline())]
        daemons = [p for p in tree if "p2pd" in p.name()]
        assert len(nodes) == 3 and len(daemons) == 3, [p.cmdline() for p in tree]
        proc.send_signal(sig)  # what a terminal Ctrl-C (or `kill`) does: only the demo gets it
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output
    gone, alive = psutil.wait_procs(tree, timeout=10)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
    assert not _processes_using(out)


@pytest.mark.slow
def test_a_failing_node_fails_the_demo_with_its_log(tmp_path):
    out = tmp_path / "run"
    proc = _demo(out, "--quick", "--warmstart-steps", "0", "--set", "model.name=/nonexistent/model")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output
    assert "demo failed: node tiny-s exited (code 2) before its swarm started" in output
    assert "cannot load model" in output  # the node's own error line, from its console.log
    assert not _processes_using(out)


def _processes_using(out: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(out) in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found

"""`swarm-node peers`: a light client lists the live nodes of a real 2-node swarm on 127.0.0.1."""

import json
import subprocess
import sys

import pytest

from swarm_node.commands.peers import render
from swarm_node.harness.process import NodeProcess


def test_render_is_one_line_per_peer():
    rows = [{"peer_id": "QmA", "model": "tiny-s", "tokenizer": "sha256:abcd", "protocol": 1, "round": 3,
             "policy_version": 2, "offers": 1, "reach": "relay", "last_seen_s": 0.5}]
    text = render(rows, "r").splitlines()
    assert "QmA" in text[2] and "tiny-s" in text[2] and " relay " in text[2] and text[-1] == "1 peer(s) of run 'r'"
    assert "reach" in text[0]
    assert render([], "r") == "no peers of run 'r' answered (check --peers and --run-id)"
    # red team 12: a peer's model id and tokenizer are its claims; escape sequences in them moved the cursor
    # up and erased the honest peer's row above
    rows.append({**rows[0], "peer_id": "QmB", "model": "\x1b[1A\x1b[2K\r", "tokenizer": "\x1b[8m\n"})
    text = render(rows, "r")
    assert "\x1b" not in text and len(text.splitlines()) == 5 and "QmA" in text


@pytest.mark.slow
def test_peers_lists_a_running_swarm(tmp_path, procs):
    # more rounds than the test needs: both nodes must outlive the light client's listing
    common = ["--rounds", "1000", "--run-id", "census", "--set", "threads=1", "--set", "rollout.group_size=4",
              "--set", "rollout.max_new_tokens=8", "--set", "task.eval_limit=4", "--set", "train.eval_every=0",
              "--set", "train.checkpoint_every=0", "--set", "train.warmstart_steps=0", "--set", "rollout.prompts_per_round=2", "--set", "swarm.deadline_s=5",
              "--set", "swarm.linger_s=0"]
    first = procs(NodeProcess.join(["--model", "tiny-s", *common], tmp_path / "a"))
    address = first.address()
    second = procs(NodeProcess.join(["--model", "tiny-m", "--peers", address, *common], tmp_path / "b"))
    second.status(lambda s: s["round"] >= 1, timeout=240)
    assert first.popen.poll() is None and second.popen.poll() is None
    out = subprocess.run([sys.executable, "-m", "swarm_node", "peers", "--peers", address, "--run-id", "census",
                          "--wait", "60", "--json", "--verbose", "--set", "swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(r["model"] for r in rows) == ["tiny-m", "tiny-s"], out.stdout + out.stderr[-3000:]
    for row in rows:
        assert row["protocol"] == 1 and row["tokenizer"].startswith("sha256:") and row["round"] >= 0
        assert row["reach"] == "direct"  # on 127.0.0.1 nobody needs a relay
        assert 0 <= row["last_seen_s"] < 120
    ids = {n: json.loads((tmp_path / n / "status.json").read_text())["peer_id"] for n in ("a", "b")}
    assert {r["peer_id"] for r in rows} == set(ids.values())
    # what the node writing to b/ measured of its neighbours, read from its status file (nothing joins)
    second.status(lambda s: ids["a"] in (s["neighbours"] or {}) and s["neighbours"][ids["a"]]["credits"] > 0, timeout=120)
    scores = subprocess.run([sys.executable, "-m", "swarm_node", "peers", "--scores", str(tmp_path / "b"), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert scores.returncode == 0, scores.stderr[-2000:]
    a_row = next(json.loads(line) for line in scores.stdout.splitlines() if json.loads(line)["peer_id"] == ids["a"])
    assert a_row["outbound"] is True and a_row["credits"] > 0 and a_row["addr"].startswith("/ip4/127.0.0.1/tcp/")


def test_peers_scores_renders_a_node_status_and_says_what_to_do_without_one(tmp_path):
    from swarm_node.status import StatusFile

    status = StatusFile(tmp_path, "n0", 10)
    status.update(state="running", round=4, neighbours={
        "QmIn": {"outbound": False, "credits": 0, "rounds_idle": 4, "rounds_useless": 4, "offers": False,
                 "addr": "/ip4/11.12.0.7/tcp/1"},
        "QmOut": {"outbound": True, "credits": 3, "rounds_idle": 0, "rounds_useless": 1, "offers": True, "addr": None}})
    out = subprocess.run([sys.executable, "-m", "swarm_node", "peers", "--scores", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2].split()[:6] == ["QmOut", "out", "3", "0", "1", "yes"]
    assert lines[3].split()[:6] == ["QmIn", "in", "0", "4", "4", "no"]
    assert lines[3].endswith("/ip4/11.12.0.7/tcp/1") and "2 neighbour(s) of node 'n0' (running, round 4)" in lines[-1]
    missing = subprocess.run([sys.executable, "-m", "swarm_node", "peers", "--scores", str(tmp_path / "nowhere")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "pass the --out directory of a running swarm node" in missing.stderr
    neither = subprocess.run([sys.executable, "-m", "swarm_node", "peers"], capture_output=True, text=True, timeout=60)
    assert neither.returncode != 0 and "give --peers MADDR" in neither.stderr

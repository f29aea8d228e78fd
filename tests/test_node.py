"""The node alone: rounds, metrics rows, checkpoints, resume without lost or repeated rounds."""

import json

import pytest
import torch
import yaml

from swarm_node.config import ConfigError, ModelConfig, load_config
from swarm_node.metrics import read_metrics
from swarm_node.node import run
from swarm_node.train.policy import Policy
from swarm_node.wire.codec import decode

FAST = ["model.name=tiny-s", "rollout.group_size=3", "rollout.prompts_per_round=2", "rollout.max_new_tokens=6",
        "task.eval_limit=8", "train.eval_every=2", "train.checkpoint_every=1", "train.lr=1e-2", "threads=1",
        "train.warmstart_steps=0"]


def test_alone_run_writes_metrics_config_and_checkpoints(tmp_path):
    cfg = load_config(None, FAST + ["train.rounds=3", f"out={tmp_path}"])
    rows = run(cfg)
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "eval/accuracy" in rows[3]
    assert "eval/accuracy" not in rows[1]
    for row in rows[1:]:
        for key in ("reward/mean", "time/generate_s", "time/train_s", "train/active_frac", "completions/mean_length"):
            assert key in row
    assert read_metrics(tmp_path / "metrics.jsonl") == json.loads(json.dumps(rows))
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["name"] == "tiny-s"
    assert (tmp_path / "checkpoints" / "latest").read_text() == "round-000003"


def test_out_of_distribution_task_is_built_with_its_own_options_and_evaluated_once_at_the_end(tmp_path):
    cfg = load_config(None, FAST + ["train.rounds=1", f"out={tmp_path}", "task.ood_task=arith",
                                    "task.ood_options={second_digits: 2, test_size: 5}"])
    rows = run(cfg)
    ood = [r for r in rows if "ood/accuracy" in r]
    assert len(ood) == 1 and ood[0]["round"] == 1
    assert ood[0]["ood/n"] == 5  # the options' test split (5), not eval_limit's 8 of the default one
    with pytest.raises(ConfigError, match="ood_options needs task.ood_task"):
        load_config(None, FAST + ["task.ood_options={second_digits: 2}"])


def test_resume_continues_without_gaps_or_repeats(tmp_path):
    run(load_config(None, FAST + ["train.rounds=2", f"out={tmp_path}"]))
    first = read_metrics(tmp_path / "metrics.jsonl")
    version = first[-1]["train/policy_version"]
    rows = run(load_config(None, FAST + ["train.rounds=4", f"out={tmp_path}"]), resume=True)
    assert [r["round"] for r in rows] == [3, 4]
    assert rows[0]["train/policy_version"] >= version
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_a_fresh_run_in_a_used_out_sets_the_old_metrics_aside(tmp_path):
    """Without --resume, a second run in the same OUT starts a metrics file of its own: rounds 0..N once."""
    first = run(load_config(None, FAST + ["train.rounds=2", f"out={tmp_path}"]))
    second = run(load_config(None, FAST + ["train.rounds=1", f"out={tmp_path}"]))
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [r["round"] for r in second] == [0, 1]
    kept = read_metrics(tmp_path / "metrics.previous-1.jsonl")
    assert kept == json.loads(json.dumps(first))
    run(load_config(None, FAST + ["train.rounds=1", f"out={tmp_path}"]))
    assert (tmp_path / "metrics.previous-2.jsonl").exists()  # never overwrites an older one


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    """Same prompts, RNG and optimizer state after a resume: identical metrics to a straight run."""
    straight = run(load_config(None, FAST + ["train.rounds=3", f"out={tmp_path / 'a'}"]))
    run(load_config(None, FAST + ["train.rounds=2", f"out={tmp_path / 'b'}"]))
    resumed = run(load_config(None, FAST + ["train.rounds=3", f"out={tmp_path / 'b'}"]), resume=True)
    for key in ("reward/mean", "completions/mean_length", "eval/accuracy"):
        assert resumed[-1][key] == pytest.approx(straight[-1][key], rel=1e-5, abs=1e-7)
    a = Policy.load(ModelConfig(name=str(tmp_path / "a" / "checkpoints" / "round-000003" / "model")))
    b = Policy.load(ModelConfig(name=str(tmp_path / "b" / "checkpoints" / "round-000003" / "model")))
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_resume_keeps_the_plausibility_anchor_of_the_first_step(tmp_path):
    """loss.implausible's bars are anchored at the node's first step; a resumed run keeps that anchor
    instead of taking a new one from a model that peers may have flattened meanwhile."""
    def floors(out, r):
        return json.loads((out / "checkpoints" / f"round-{r:06d}" / "state.json").read_text())["plausibility_floors"]

    run(load_config(None, FAST + ["train.rounds=1", f"out={tmp_path}"]))
    anchor = floors(tmp_path, 1)
    assert len(anchor) == 2 and all(isinstance(f, float) for f in anchor)
    run(load_config(None, FAST + ["train.rounds=3", f"out={tmp_path}"]), resume=True)
    assert floors(tmp_path, 3) == anchor


def run_pair(tmp_path, monkeypatch, network, common: list[str]) -> dict[str, list[dict]]:
    """Nodes A and B, one thread each, over `network` (MemoryTransport: no libp2p at all); their rows."""
    import threading

    import swarm_node.node as node_module
    from swarm_node.net.memory import MemoryTransport

    rows, errors = {}, []
    loading, load_policy = threading.Lock(), node_module.load_policy

    def load_one_at_a_time(*args):  # transformers' from_pretrained is not thread-safe (real nodes are processes)
        with loading:
            return load_policy(*args)

    monkeypatch.setattr(node_module, "load_policy", load_one_at_a_time)

    def node(name: str) -> None:
        cfg = load_config(None, common + [f"name={name}", f"out={tmp_path / name}"])
        try:
            rows[name] = run(cfg, connect=lambda model_id, tok: MemoryTransport(network, f"Qm{name}", model_id, tok, cfg=cfg.swarm))
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=node, args=(name,)) for name in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return rows


@pytest.mark.parametrize("prompt_mode", ["tokens", "sha256"])  # sha256: prompts by reference (SPEC 14.6)
def test_two_nodes_train_on_each_others_groups_through_an_in_memory_transport(tmp_path, monkeypatch, prompt_mode):
    """One full swarm round of two nodes with no libp2p at all: the node loop only sees a Transport."""
    from swarm_node.net.memory import MemoryNetwork
    from swarm_node.tasks import load_task
    from swarm_node.train.warmstart import warmstarted_model

    class RecordingNetwork(MemoryNetwork):
        def __init__(self):
            super().__init__()
            self.served: dict[str, dict[str, bytes]] = {}  # every packet each node ever served

        def serve_as(self, peer_id: str, packets: dict[str, bytes]) -> None:
            self.served.setdefault(peer_id, {}).update(packets)
            super().serve_as(peer_id, packets)

    network = RecordingNetwork()
    # staleness 0: each round uses exactly the peer's packet of that round (lockstep).
    # A warm start gives the tiny models some reward signal, so groups carry non-zero advantages;
    # it is cached once here (both nodes share the recipe), which also imports transformers' model
    # classes before two threads would race on its lazy imports
    common = FAST + ["train.rounds=2", "train.warmstart_steps=100", "swarm.deadline_s=60", "swarm.linger_s=1",
                     "swarm.run_id=mem", "rollout.group_size=4", "swarm.staleness=0",
              "swarm.alone_wait_s=60", f"swarm.prompts={prompt_mode}",  # whichever node starts first waits for the other
              "swarm.guard_every=0"]  # the guard's reserve drops peers' groups on its problems: not every round would have one
    warmstarted_model(load_config(None, common), load_task("arith"))
    # no train.seed on either, as volunteers run: their prompts must still differ (rollout.draws_key)
    rows = run_pair(tmp_path, monkeypatch, network, common)
    for name in ("A", "B"):
        trained = rows[name][1:]
        assert [r["round"] for r in trained] == [1, 2]
        for row in trained:
            assert row["swarm/packets_accepted"] >= 1 and row["swarm/peer_groups_used"] >= 1
            assert row["train/groups"] == 2 + row["swarm/peer_groups_used"]
            assert row["swarm/packets_rejected"] == 0 and row["swarm/packet_bytes_out"] > 0
        status = json.loads((tmp_path / name / "status.json").read_text())
        assert status["state"] == "finished" and status["peer_id"] == f"Qm{name}" and status["round"] == 2
        other = f"Qm{'B' if name == 'A' else 'A'}"
        assert set(status["neighbours"]) == {other} and set(status["neighbours"][other]) == {
            "outbound", "credits", "rounds_idle", "rounds_useless", "offers", "addr"}
    prompts = {name: {p.round: {g.example_id for g in p.groups} for p in map(decode, network.served[f"Qm{name}"].values())}
               for name in ("A", "B")}
    assert set(prompts["A"]) == set(prompts["B"]) == {1, 2}
    assert all(not prompts["A"][r] & prompts["B"][r] for r in (1, 2)), prompts
    prompt_lengths = {len(g.prompt_tokens) for name in ("A", "B") for p in map(decode, network.served[f"Qm{name}"].values())
                      for g in p.groups}
    assert prompt_lengths == {20} if prompt_mode == "sha256" else min(prompt_lengths) > 20  # 20 digits of base 100


def test_horizontal_nodes_whose_shares_are_equal_do_not_wait_out_the_deadline(tmp_path, monkeypatch):
    """Two nodes with one model and one seed write the same share of every group. Horizontal mode
    drops a share equal to ours instead of refusing the packet as an echo: refused, every round
    waited the full deadline (the real-model study's horizontal runs, 2026-11-27). Such a packet
    earns no credit, so a peer that only ever repeats our shares loses its slot like an idle one."""
    from swarm_node.net.memory import MemoryNetwork

    common = FAST + ["train.rounds=1", "train.seed=7", "swarm.mode=horizontal", "swarm.deadline_s=30",
                     "swarm.linger_s=1", "swarm.run_id=same", "swarm.staleness=0", "swarm.alone_wait_s=60",
                     "train.eval_every=0", "train.checkpoint_every=0",
                     "swarm.guard_every=0"]  # the guard's reserve would drop some of the run's prompts from a step
    rows = run_pair(tmp_path, monkeypatch, MemoryNetwork(), common)
    for name in ("A", "B"):
        for row in rows[name][1:]:
            assert row["swarm/groups_duplicate"] == 2 and row["swarm/packets_accepted"] == 1, row
            assert "swarm/rejected/echo" not in row and row["train/sequences"] == 6, row  # our 2 shares of 3
            assert row["time/exchange_s"] < 20, row

"""The node alone: rounds, metrics rows, checkpoints, resume without lost or repeated rounds."""

import json

import pytest
import torch
import yaml

from swarm_node.backend import Policy
from swarm_node.config import ModelConfig

from swarm_node.config import load_config
from swarm_node.metrics import read_metrics
from swarm_node.node import run

FAST = ["model.name=tiny-s", "rollout.group_size=3", "rollout.prompts_per_round=2", "rollout.max_new_tokens=6",
        "task.eval_limit=8", "train.eval_every=2", "train.checkpoint_every=1", "train.lr=1e-2", "threads=1"]


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


def test_resume_continues_without_gaps_or_repeats(tmp_path):
    run(load_config(None, FAST + ["train.rounds=2", f"out={tmp_path}"]))
    first = read_metrics(tmp_path / "metrics.jsonl")
    version = first[-1]["train/policy_version"]
    rows = run(load_config(None, FAST + ["train.rounds=4", f"out={tmp_path}"]), resume=True)
    assert [r["round"] for r in rows] == [3, 4]
    assert rows[0]["train/policy_version"] >= version
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]


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

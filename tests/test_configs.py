"""configs/: every YAML loads and validates; the paper configs carry the paper's hyperparameters."""

from collections import Counter
from pathlib import Path

import pytest

from swarm_node.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALL = sorted(CONFIGS.rglob("*.yaml"))
PAPER = sorted((CONFIGS / "paper").rglob("*.yaml"))
PAPER_MODELS = {"Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-Coder-1.5B", "Qwen/Qwen2.5-Coder-3B"}


def experiment_dirs() -> list[Path]:
    return sorted(d for d in (CONFIGS / "paper").iterdir() if d.is_dir() and d.name != "alone")


def test_there_are_configs():
    assert len(ALL) >= 30 and (CONFIGS / "alone.yaml").exists() and (CONFIGS / "README.md").exists()


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_loads_and_validates(path):
    cfg = load_config(path)
    assert cfg.name and cfg.out.startswith("runs/")
    assert cfg.rollout.temperature > 0 and cfg.train.rounds > 0


@pytest.mark.parametrize("path", PAPER, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_paper_hyperparameters(path):
    cfg = load_config(path)
    assert cfg.model.name in PAPER_MODELS
    assert (cfg.task.name, cfg.task.data, cfg.task.eval_limit) == ("gsm8k", "openai/gsm8k", 0)
    assert (cfg.task.ood_task, cfg.task.ood_data) == ("math500", "HuggingFaceH4/MATH-500")
    # batch 24: alone, 2 own groups of 12; in a swarm, 1 own group + 1 peer group (vertical)
    alone = "/alone/" in str(path)
    assert (cfg.rollout.group_size, cfg.rollout.prompts_per_round) == (12, 2 if alone else 1)
    assert alone or cfg.swarm.peer_groups_per_own == 1.0
    assert (cfg.rollout.max_new_tokens, cfg.rollout.temperature) == (512, 1.0)
    assert cfg.train.rounds == 50 and cfg.loss.C == 2.0
    if cfg.model.lora_r:
        assert cfg.model.lora_r == 128 and cfg.model.lora_targets == ["q_proj", "v_proj"] and cfg.train.lr == 1e-5
    else:
        assert cfg.train.lr == 1e-6
    assert "our assumption" in path.read_text()  # the learning rate is not the paper's


@pytest.mark.parametrize("exp", experiment_dirs(), ids=lambda d: d.name)
def test_each_experiment_is_one_swarm(exp):
    cfgs = [load_config(p) for p in sorted(exp.glob("*.yaml"))]
    assert len(cfgs) >= 2
    assert len({c.swarm.run_id for c in cfgs}) == 1 and cfgs[0].swarm.run_id == f"paper-{exp.name}"
    assert len({c.name for c in cfgs}) == len(cfgs) and len({c.out for c in cfgs}) == len(cfgs)
    assert len({c.train.seed for c in cfgs}) == len(cfgs)  # vertical: every node its own prompts
    assert len({c.swarm.identity for c in cfgs}) == len(cfgs)
    assert len({(c.loss.variant, c.loss.g, c.swarm.mode) for c in cfgs}) == 1


def test_the_paper_experiments_are_all_there():
    setups = {d.name: [load_config(p) for p in sorted(d.glob("*.yaml"))] for d in experiment_dirs()}

    def models(name):
        return sorted((c.model.name, c.model.lora_r) for c in setups[name])

    q15, q3, c15, c3 = "Qwen/Qwen2.5-1.5B", "Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-Coder-1.5B", "Qwen/Qwen2.5-Coder-3B"
    assert models("size-qwen") == [(q15, 0), (q3, 0)]
    assert models("size-coder") == [(c15, 0), (c3, 0)]
    assert models("expertise-1.5b") == [(q15, 0), (c15, 0)]
    assert models("expertise-3b") == [(q3, 0), (c3, 0)]
    assert models("trainable-1.5b") == [(q15, 0), (q15, 128)]
    assert models("trainable-3b") == [(q3, 0), (q3, 128)]
    assert {c.swarm.mode for c in setups["horizontal"]} == {"horizontal"}
    assert {c.swarm.mode for c in setups["size-qwen"]} == {"vertical"}
    assert sorted(c.loss.g for name in ("g-5", "g-10", "g-50", "g-100") for c in setups[name][:1]) == [5, 10, 50, 100]
    assert {c.loss.variant for c in setups["f-vis"]} == {"f-vis"}
    assert {c.loss.variant for name, cs in setups.items() if name != "f-vis" for c in cs} == {"f-tis"}
    assert Counter(c.loss.g for cs in setups.values() for c in cs)[50.0] >= 2


def test_alone_baselines_cover_every_paper_model():
    alone = [load_config(p) for p in sorted((CONFIGS / "paper" / "alone").glob("*.yaml"))]
    assert {c.model.name for c in alone} == PAPER_MODELS
    assert {c.loss.variant for c in alone} == {"grpo"}
    assert {(c.model.name, c.model.lora_r) for c in alone} >= {("Qwen/Qwen2.5-1.5B", 128), ("Qwen/Qwen2.5-3B", 128)}


def test_demo_nodes_are_heterogeneous():
    demo = [load_config(p) for p in sorted((CONFIGS / "demo").glob("*.yaml"))]
    assert len(demo) == 3
    assert len({c.model.name for c in demo}) >= 2  # sizes differ
    assert {c.model.lora_r > 0 for c in demo} == {True, False}  # trainable parameters differ
    assert len({c.name for c in demo}) == 3 and len({c.train.seed for c in demo}) == 3
    for c in demo:
        assert c.threads == 1 and c.task.name == "arith" and c.train.warmstart_steps > 0
        assert c.swarm.min_peers == len(demo) - 1  # rounds advance together: each waits for both peers
    alone = load_config(CONFIGS / "alone.yaml")
    tiny_s = next(c for c in demo if c.model.name == "tiny-s" and c.model.lora_r == 0)
    # the README's alone run reuses the demo's cached tiny-s warm start (same recipe)
    for key in ("warmstart_steps", "warmstart_lr", "warmstart_batch"):
        assert getattr(alone.train, key) == getattr(tiny_s.train, key)
    assert alone.task.options == tiny_s.task.options and alone.model.init_seed == tiny_s.model.init_seed

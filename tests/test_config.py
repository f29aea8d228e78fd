"""Config: defaults follow the paper, YAML + overrides, validation with clear messages."""

import pytest
import yaml

from swarm_node.config import ConfigError, load_config


def test_defaults_follow_the_paper():
    from swarm_node.train.defaults import resolve_model_defaults

    cfg, _ = resolve_model_defaults(load_config(None, ["model.name=Qwen/Qwen2.5-3B"]))
    assert cfg.rollout.group_size == 12 and cfg.rollout.prompts_per_round == 2  # batch 24
    assert cfg.train.lr == 1e-6 and cfg.train.warmstart_steps == 0
    tiny, _ = resolve_model_defaults(load_config(None, ["model.name=tiny-s"]))  # a batch that learns visibly
    assert tiny.rollout.prompts_per_round == 16 and tiny.train.lr == 1e-4 and tiny.train.warmstart_steps == 900
    small, _ = resolve_model_defaults(load_config(None, ["model.name=tiny-s", "rollout.prompts_per_round=2"]))
    assert small.train.lr == 2e-5  # 1e-4 at 2 prompts per round destroys a tiny preset
    assert cfg.loss.variant == "f-tis" and cfg.loss.C == 2.0 and cfg.loss.g == 50.0 and cfg.loss.eps == 0.2
    assert cfg.train.rounds == 50
    assert cfg.model.lora_targets == ["q_proj", "v_proj"]


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": {"name": "tiny-m", "lora_r": 8}, "train": {"lr": 0.01}}))
    cfg = load_config(path, ["train.lr=0.5", "loss.variant=tis", "swarm.peers=['/ip4/1.2.3.4/tcp/1']"])
    assert cfg.model.name == "tiny-m" and cfg.model.lora_r == 8
    assert cfg.train.lr == 0.5 and cfg.loss.variant == "tis"
    assert cfg.swarm.peers == ["/ip4/1.2.3.4/tcp/1"]
    assert cfg.name == "tiny-m"


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.name=tiny-l", "swarm.mode=horizontal", "task.options={digits: 1}"])
    cfg.save(tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg


@pytest.mark.parametrize("override, message", [
    ("train.lrr=1", "unknown config key 'train.lrr'"),
    ("bogus.x=1", "unknown config key 'bogus'"),
    ("loss.variant=ppo", "variant"),
    ("rollout.group_size=1", "group_size must be >= 2"),
    ("swarm.mode=diagonal", "vertical|horizontal"),
    ("model.dtype=int8", "model.dtype"),
    ("train.lr=-1", "train.lr must be > 0"),
    ("train", "section.key=value"),
])
def test_bad_values_are_one_clear_error(override, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|").replace("(", r"\(")):
        load_config(None, [override])


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_yaml_ambiguities_are_coerced_and_types_checked():
    cfg = load_config(None, ["train.lr=1e-2", "loss.C=3", "train.rounds=7"])
    assert cfg.train.lr == 0.01 and isinstance(cfg.loss.C, float) and cfg.train.rounds == 7
    with pytest.raises(ConfigError, match="train.rounds: expected int"):
        load_config(None, ["train.rounds=many"])
    with pytest.raises(ConfigError, match="swarm.peers: expected a list"):
        load_config(None, ["swarm.peers=3"])

"""A real pretrained model in the loop: SmolLM2-135M-Instruct, fetched by `make models` (swarm_node/train/sources.py).

Skipped, with the command that fetches it, where it is not installed. Loading takes ~1 s (the
converted safetensors); the whole module runs in well under a minute on one CPU thread.
"""

import numpy as np
import pytest
import torch

from swarm_node.config import ModelConfig, NodeConfig, RolloutConfig
from swarm_node.train.sources import installed

pytestmark = pytest.mark.skipif(installed("smollm2-135m") is None,
                                reason="smollm2-135m is not installed: run `make models` "
                                       "(or `swarm-node models fetch smollm2-135m`)")


@pytest.fixture(scope="module")
def smol():
    from swarm_node.train.policy import Policy

    return Policy.load(ModelConfig(name="smollm2-135m"))


@pytest.fixture(scope="module")
def greedy_answers(smol):
    """Greedy completions of the first 8 held-out arith problems, rendered as the node renders them."""
    from swarm_node.tasks import load_task
    from swarm_node.train.rollout import prompt_tokens
    from swarm_node.train.sampling.hf import HFSampler

    task = load_task("arith")
    examples = [task.split("test")[i] for i in range(8)]
    samples = HFSampler(smol).greedy([prompt_tokens(smol, task, ex) for ex in examples], task.chat_max_new_tokens)
    return task, examples, samples


def test_it_loads_as_the_real_model_with_its_tokenizer_and_chat_template(smol):
    assert type(smol.model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in smol.model.parameters()) == 134_515_008
    assert smol.vocab_size == 49_152 and smol.tokenizer.eos_token == "<|im_end|>" and smol.eos_id == 2
    assert all(p.dtype == torch.float32 for p in smol.model.parameters())  # no quantizer left behind
    assert not hasattr(smol.model.config, "quantization_config")


def test_arith_prompts_are_rendered_with_the_chat_template_and_one_worked_exchange(smol):
    from swarm_node.tasks import load_task
    from swarm_node.train.rollout import prompt_tokens

    task = load_task("arith")
    ex = task.split("test")[0]
    shown, completion = task.demonstration()
    text = smol.decode(prompt_tokens(smol, task, ex))  # special tokens skipped
    ids = prompt_tokens(smol, task, ex)
    rendered = smol.tokenizer.decode(ids)
    assert rendered.startswith("<|im_start|>system\n") and rendered.endswith(
        f"<|im_start|>user\n{ex.question}<|im_end|>\n<|im_start|>assistant\n")
    assert f"<|im_start|>user\n{shown.question}<|im_end|>\n<|im_start|>assistant\n{completion}<|im_end|>" in rendered
    assert ids.count(smol.eos_id) == 4  # the system turn, the worked exchange (2) and the question end with EOS
    assert "####" in text and task.reward(completion, shown) == 1.0


def test_greedy_answers_stop_at_eos_and_the_reward_parses_them(greedy_answers, smol):
    """What the model writes after the worked exchange: `a + b = c`, then `#### c`, then <|im_end|>."""
    task, examples, samples = greedy_answers
    texts = [smol.decode(s.tokens) for s in samples]
    stopped = [s for s in samples if s.finish_reason == "stop"]
    assert len(stopped) >= 6 and all(s.tokens[-1] == smol.eos_id for s in stopped)
    assert all("<|im_end|>" not in t for t in texts)
    assert np.mean([task.format_ok(t) for t in texts]) >= 0.75  # measured: 40 of 40 greedy answers
    for text, ex in zip(texts, examples):  # the reward is exactly "the answer line is `#### <gold>`" here
        last = text.strip().splitlines()[-1].strip() if text.strip() else ""
        assert task.reward(text, ex) == float(last in (f"#### {ex.answer}", f"#### {ex.answer}."))


def _lora_policy():
    from swarm_node.train.policy import Policy

    return Policy.load(ModelConfig(name="smollm2-135m", lora_r=8))


@pytest.mark.slow  # one real training step (~20 s on one thread)
def test_lora_sits_on_the_real_attention_projections_and_one_round_changes_every_B_matrix(tmp_path):
    from swarm_node.tasks import load_task
    from swarm_node.train.batch import TrainBatch
    from swarm_node.train.checkpoint import save_checkpoint
    from swarm_node.train.defaults import resolve
    from swarm_node.train.rollout import generate_groups
    from swarm_node.train.sampling.hf import HFSampler
    from swarm_node.train.trainer import Trainer

    policy = _lora_policy()
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert len(names) == 30 * 2 * 2  # 30 layers x (q_proj, v_proj) x (A, B)
    assert all(("q_proj" in n or "v_proj" in n) and "lora_" in n for n in names)
    task = load_task("arith")
    cfg, _ = resolve(NodeConfig(model=ModelConfig(name="smollm2-135m", lora_r=8),
                                rollout=RolloutConfig(group_size=4, prompts_per_round=2, max_new_tokens=12),
                                train=__import__("swarm_node.config").config.TrainConfig(lr=1e-3)), task)
    examples = [task.split("train")[i] for i in (3, 8)]
    groups = generate_groups(HFSampler(policy), policy, task, examples, cfg.rollout, seed=0)
    for g in groups:  # make every group informative whatever the samples were: rewards 1,0,1,0,...
        for k, c in enumerate(g.completions):
            c.reward = float(k % 2 == 0)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    stats = Trainer(policy, cfg.train, cfg.loss, cfg.rollout.temperature).step(TrainBatch.from_groups(groups, policy.pad_id))
    assert stats["train/active_frac"] == 1.0
    changed = {n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])}
    # B starts at zero, so the first step moves every B and no A (dL/dA = 0 while B = 0)
    assert changed == {n for n in before if "lora_B" in n} and len(changed) == 60

    # the checkpoint holds only the adapter, and peft loads it back onto the base model bit for bit
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = save_checkpoint(tmp_path, policy, torch.optim.AdamW(policy.trainable_parameters()),
                           {"round": 1, "policy_version": 1}, cfg)
    assert (ckpt / "model" / "adapter_model.safetensors").is_file()
    assert not (ckpt / "model" / "model.safetensors").exists()
    base = AutoModelForCausalLM.from_pretrained(str(installed("smollm2-135m")), dtype=torch.float32)
    reloaded = PeftModel.from_pretrained(base, str(ckpt / "model")).eval()
    ids = torch.tensor([groups[0].prompt_tokens.astype(np.int64).tolist()])
    policy.model.eval()
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, policy.model(ids).logits)


def test_a_full_weight_checkpoint_loads_back_in_transformers(smol, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smol.save(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    assert tokenizer.chat_template == smol.tokenizer.chat_template
    ids = torch.tensor([smol.encode("What is 47 plus 4?")])
    smol.model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, smol.model(ids).logits)

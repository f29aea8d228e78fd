"""Policy backend: presets, tokenizer, chunked scoring, LoRA."""

import pytest
import torch

from swarm_node.config import ModelConfig
from swarm_node.train.policy import ModelError, Policy
from swarm_node.train.presets import CHAR_VOCAB, PRESETS, char_tokenizer

PROMPTS = ["Q: What is 48 plus 27?\nA: ", "Q: 3?\nA: "]


@pytest.fixture(scope="module")
def policy():
    return Policy.load(ModelConfig(name="tiny-s", init_seed=1))


def test_char_tokenizer_round_trip():
    tok = char_tokenizer()
    text = "Q: What is 48 plus 27?\nA: #### 75\t~"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert len(tok) == len(CHAR_VOCAB)
    assert tok.eos_token_id == 1 and tok.pad_token_id == 0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_tiny_and_deterministic(name):
    a = Policy.load(ModelConfig(name=name, init_seed=3))
    b = Policy.load(ModelConfig(name=name, init_seed=3))
    n = sum(p.numel() for p in a.model.parameters())
    assert 0.1e6 <= n <= 5e6
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_preset_saves_and_reloads_as_local_path(policy, tmp_path):
    policy.save(tmp_path / "m")
    again = Policy.load(ModelConfig(name=str(tmp_path / "m")))
    ids = torch.tensor([policy.encode(PROMPTS[0])])
    with torch.no_grad():
        assert torch.allclose(policy.model(ids).logits, again.model(ids).logits, atol=1e-6)
    assert again.encode(PROMPTS[0]) == policy.encode(PROMPTS[0])


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="cannot load model"):
        Policy.load(ModelConfig(name=str(tmp_path / "nope")))


def test_chunked_logprobs_equal_unchunked_with_grads(policy):
    prompts = [policy.encode(p) for p in PROMPTS]
    completions = [policy.encode("#### 75 and more text"), policy.encode("#### 1")]
    grads = []
    for chunk in (1, 3, 1000):
        policy.model.zero_grad()
        logp, mask = policy.token_logprobs(prompts, completions, 1.0, chunk=chunk)
        (logp * mask).sum().backward()
        grads.append([p.grad.clone() for p in policy.trainable_parameters()])
        assert logp.shape == (2, len(completions[0]))
        assert mask[1].sum() == len(completions[1]) and (logp[1, len(completions[1]):] == 0).all()
    for other in grads[1:]:
        for g0, g1 in zip(grads[0], other):
            assert torch.allclose(g0, g1, atol=1e-5)


def test_lora_trains_only_the_adapter():
    pol = Policy.load(ModelConfig(name="tiny-s", lora_r=4))
    names = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert any("q_proj" in n for n in names) and any("v_proj" in n for n in names)

"""The HF sampler: shapes, finish reasons, log-probs of the distribution sampled from, seeds, device."""

import pytest
import torch

from swarm_node.config import ModelConfig
from swarm_node.train.policy import Policy
from swarm_node.train.sampling.hf import HFSampler

PROMPTS = ["Q: What is 48 plus 27?\nA: ", "Q: 3?\nA: "]


@pytest.fixture(scope="module")
def policy():
    return Policy.load(ModelConfig(name="tiny-s", init_seed=1))


def test_generate_shapes_and_finish_reasons(policy):
    prompts = [policy.encode(p) for p in PROMPTS]
    out = HFSampler(policy).sample(prompts, n=3, max_new_tokens=7, temperature=1.0, seed=0)
    assert len(out) == 2 and all(len(g) == 3 for g in out)
    for sample in (s for g in out for s in g):
        assert len(sample.tokens) == len(sample.logprobs) <= 7
        assert all(lp <= 0 for lp in sample.logprobs)
        # a completion that stopped keeps its EOS (and its log-prob): stopping is what must be learned
        stopped = sample.finish_reason == "stop"
        assert (sample.tokens[-1] == policy.eos_id) == stopped
        assert policy.eos_id not in sample.tokens[:-1]
        assert stopped or len(sample.tokens) == 7
    assert any(s.finish_reason == "stop" for g in out for s in g)  # seed 0 exercises both cases
    assert any(s.finish_reason == "length" for g in out for s in g)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generator_logprobs_match_training_logprobs(policy, temperature):
    """The log-probs a node reports for its samples are what its trainer computes: ratio == 1."""
    prompts = [policy.encode(p) for p in PROMPTS]
    out = HFSampler(policy).sample(prompts, n=4, max_new_tokens=12, temperature=temperature, seed=1)
    flat_prompts = [p for p, g in zip(prompts, out) for _ in g]
    samples = [s for g in out for s in g]
    logp, mask = policy.token_logprobs(flat_prompts, [s.tokens for s in samples], temperature, chunk=5)
    for i, s in enumerate(samples):
        assert mask[i].sum() == len(s.tokens)
        assert torch.allclose(logp[i, :len(s.tokens)], torch.tensor(s.logprobs), atol=1e-4)


def test_greedy_is_deterministic(policy):
    prompts = [policy.encode(PROMPTS[0]), policy.encode(PROMPTS[1])]
    sampler = HFSampler(policy)
    a, b = sampler.greedy(prompts, 10), sampler.greedy(prompts, 10)
    assert [s.tokens for s in a] == [s.tokens for s in b] and len(a) == 2


def test_sampling_is_a_function_of_the_seed(policy):
    """A round's samples depend only on its seed: a resumed run repeats exactly what it would have drawn."""
    prompts = [policy.encode(PROMPTS[0])]
    sampler = HFSampler(policy)
    a = sampler.sample(prompts, 6, 10, 1.0, seed=5)
    b = sampler.sample(prompts, 6, 10, 1.0, seed=99)
    assert [s.tokens for s in sampler.sample(prompts, 6, 10, 1.0, seed=5)[0]] == [s.tokens for s in a[0]]
    assert [s.tokens for s in a[0]] != [s.tokens for s in b[0]]


def test_generator_is_created_on_the_policy_device(policy, monkeypatch):
    """torch refuses a CPU generator for CUDA probabilities (the round-1 crash on GPUs): the sampler
    must ask for its generator on the policy's device, explicitly, every time it samples."""
    requested = []
    real = torch.Generator

    def recording(device=None):
        requested.append(device)
        return real()

    monkeypatch.setattr(torch, "Generator", recording)
    HFSampler(policy).sample([policy.encode(PROMPTS[0])], 2, 3, 1.0, seed=0)
    assert requested == [policy.device]


def test_prefill_sends_only_the_last_position_through_the_lm_head(policy):
    """Only the next token's logits are needed: a [B, P, V] prefill logits tensor is wasted memory."""
    widths = []
    hook = policy.model.get_output_embeddings().register_forward_pre_hook(lambda mod, args: widths.append(args[0].shape[1]))
    try:
        HFSampler(policy).sample([policy.encode(PROMPTS[0])], 2, 4, 1.0, seed=0)
    finally:
        hook.remove()
    assert widths and set(widths) == {1}

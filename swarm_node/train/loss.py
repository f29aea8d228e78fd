r"""The F-TIS policy-loss family for collaborative GRPO (pure functions, no logging).

Paper: "F-TIS: Harnessing Diverse Models in Collaborative GRPO". A swarm node trains on
completions that other peers (other models / stale weights) generated, so every token
y_it comes from a generator pi_gen that is not our policy pi_theta.

Notation (one batch, B sequences, T token slots):
    logp_it = log pi_theta(y_it | ...)       current policy, carries the gradient
    gen_it  = log pi_gen(y_it | ...)         what the generator reported (no grad)
    m_it    = 1 for completion tokens, 0 for padding;  |a_i| = max(1, sum_t m_it)
    A_i     = group-normalised advantage (group_advantages below)
    pi_old := the policy at the start of this update = logp.detach(): one optimisation
              step per batch, so pi_theta/pi_old == 1 in value but carries the gradient.

Group advantages (GRPO, std with Bessel's correction as in TRL):
    A_i = (r_i - mean_g) / (std_g + eps)
    A_i = 0 if group g has one member or zero std.

Per-token PPO-clip term with ratio R_it (eps = clip range):
    term_it = min(R_it * A_i, clip(R_it, 1 - eps, 1 + eps) * A_i)
  nois / grpo : R_it = pi_theta/pi_old = exp(logp_it - sg(logp_it))  (treat data as on-policy)
  vis         : R_it = pi_theta/pi_gen = exp(logp_it - gen_it)      (vanilla IS in the clip)
  tis         : term_it = w_it * min(R*A, clip(R)*A) with R as in nois and the DETACHED
                truncated weight w_it = min(exp(logp_it - gen_it), C)   (Yao et al.)
  (the paper prints clip(R*A, ...); we use clip(R, ...) * A, the standard PPO form.)

Filter (f-nois, f-vis, f-tis). Per-sequence divergence from the sampled tokens only:
    x_it = clamp(gen_it - logp_it, -20, 20)   (detached; x = log pi_gen/pi_theta at y ~ pi_gen)
    k1 = x              unbiased per-token estimate of KL(pi_gen || pi_theta) under y ~ pi_gen
    k2 = x^2 / 2        low-variance, biased; equals either KL direction to 2nd order in x
    k3 = e^x - x - 1    >= 0; Schulman's k3 for KL(pi_theta || pi_gen), which is unbiased
                        only for y ~ pi_theta. Our y ~ pi_gen, so it is a plug-in estimate
                        (E_gen[k3] = chi2(pi_gen||pi_theta) - KL(pi_gen||pi_theta)).
                        Default; the estimator is configurable (LossConfig.kl_estimator).
    D_i = sum_t m_it k_it  (kl_reduce="sum", default)  or  that sum / |a_i|  ("mean")
    keep_i = (A_i > 0) or (D_i < g);   otherwise A_i := 0
  A dropped sequence still counts in B below; its gradient is exactly zero.

Defences against forged generator log-probs (a peer controls gen_it; LossConfig: the first two on by default):
    C_negative          w_it = min(exp(logp_it - gen_it), C_negative) where A_i < 0: with 1.0 a
                        negative sample is never up-weighted, whatever the peer claims
    positive_floor      w_it = max(w_it, positive_floor) where A_i > 0: with 1.0 a correct sample is
                        never down-weighted. Both at 1.0: within a group the weighted negative mass
                        never exceeds the positive mass, so a group cannot push down on balance what
                        its correct samples share with its wrong ones (the poisoning of issue 18)
    check_certain_claims  a completion of >= 2 tokens claiming gen_it == 0 on every token (probability
                        1 at T = 1, which no sampler reports) is treated as on-policy: gen_i := logp_i
  For the node's own samples pi_theta ~ pi_gen (weight ~1), so the first two change them only by
  float noise; they change how honest peers' off-policy samples are weighted (see bench/poisoning.py).

Peers teach, never un-teach (`teach_only`, LossConfig.peer_negative_weight w, default 0):
    A_i := w * A_i   where sample i came from a peer outside swarm.trusted_peers and A_i < 0
  A peer chooses which genuine-looking completions it sends, so its negatives can push down exactly
  what this node writes when it is right (the gold digits after `#### `), while its positives, which
  the node's own reward verified, raise the same digits only after a prefix it never writes. With
  w = 0 an untrusted peer's data can only raise the likelihood of completions this node's reward
  verified correct; w = 1 is the paper's objective for every peer (and always for trusted peers).
    A_i := min(A_i, a)   where sample i came from such a peer (LossConfig.peer_max_advantage a,
                         default 1.0, what a half-correct group gives its positives; None: uncapped)
  A group's one correct completion among G - 1 wrong ones gets A = sqrt(G - 1) (3.3 at G = 12),
  the largest push one sample can carry, and a peer chooses which groups it sends that way: the red
  team's `skew` sent only such groups, on the problems whose answer ends in 0.

Plausible teaching only (`implausible`, LossConfig.peer_plausibility_margin m, default 1 nat):
    A_i := 0   where sample i came from an untrusted peer, A_i > 0 and
               (1/|a_i|) sum_t m_it logp_it  <  F_mean   or   min_t logp_it  <  F_token
    F_mean  = max(q05(own mean per-token log-prob) - m, its value at the node's first step)
    F_token = max(q05(own worst token log-prob) - m,    its value at the node's first step)
  q05(own ...): 5th percentiles over the node's own samples in the step, as its sampler reported
  them. Verified-correct is not enough: correct completions that the node would never write
  ("kq\n#### 73") teach it a context in which it has never learned the answer, and drove a node
  from 0.14 to 0.03 held-out pass@1 in 100 rounds with every negative dropped. The worst-token
  bar stops a single implausible token hidden in a likely completion (the mean dilutes it); the
  first-step anchor stops a ratchet: positives that just pass flatten the node's distribution,
  which lowers its percentiles and so the bar, until junk-prefixed positives pass (red team:
  0.14 -> 0.01 with a bar that followed the node down). An untrusted peer's sample is also taken
  as on-policy (gen_logp := logp): its claimed log-probs cannot raise its weight above 1.
  Nor much longer than ours (the trainer, same switch): such a positive with more than 1.25x the tokens
  of the median length of the node's correct completions of the step (bounded below and above from the first step
  that had one: Trainer._length_bound) teaches nothing;
  correct but padded completions teach a node to write longer, which no accuracy check sees.

Aggregation (GRPO/DAPO per-sequence mean; no KL penalty term):
    loss = -(1/B) * sum_i (1/|a_i|) * sum_t m_it * term_it
  A sequence with no completion tokens contributes 0.

Numerics: every log-ratio is clamped to [-20, 20] before exp (no inf). For the ratios that
carry a gradient the clamp acts on the value only: R = exp(sg(clamp(l)) + logp - sg(logp)),
so dR/dlogp = R (the capped value) and tokens beyond the clamp keep a finite gradient.
Padding positions are replaced by 0 before any arithmetic, so NaN/inf in padding is harmless.
Stats with no completion tokens: ratio stats 1.0, fractions and kl_mean 0.0 (never NaN).
"""
from __future__ import annotations

import torch
from torch import Tensor

LOG_CLAMP = 20.0  # |log-ratio| cap before exp; e^20 ~ 4.9e8
# variant -> (base variant, filtered?); config.py lists the same names to validate LossConfig.variant
VARIANTS = {
    "nois": ("nois", False), "grpo": ("nois", False), "vis": ("vis", False), "tis": ("tis", False),
    "f-nois": ("nois", True), "f-vis": ("vis", True), "f-tis": ("tis", True),
}
KL_ESTIMATORS = ("k1", "k2", "k3")
KL_REDUCES = ("sum", "mean")
STAT_KEYS = (
    "is/ratio_mean", "is/ratio_min", "is/ratio_max", "is/truncated_frac",
    "filter/dropped_frac", "filter/kl_mean", "loss/clip_frac", "loss/policy", "filter/certain_claims_frac",
)


def group_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-4) -> Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps) (Bessel std); 0 for singleton or zero-std groups.
    group_ids: any integer labels, in any order."""
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(f"rewards and group_ids must both be [N], got {tuple(rewards.shape)} and {tuple(group_ids.shape)}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    r = rewards.detach().to(torch.float64)  # [N]
    _, inv = torch.unique(group_ids, return_inverse=True)  # [N] dense group index 0..G-1
    G = int(inv.max()) + 1 if inv.numel() else 0
    cnt = torch.bincount(inv, minlength=G).to(r.dtype)  # [G]
    mean = torch.zeros(G, dtype=r.dtype, device=r.device).index_add_(0, inv, r) / cnt  # [G]
    dev = r - mean[inv]  # [N]
    var = torch.zeros_like(mean).index_add_(0, inv, dev * dev) / (cnt - 1).clamp(min=1)  # [G] unbiased
    hi = torch.full_like(mean, -float("inf")).scatter_reduce_(0, inv, r, "amax")  # [G]
    lo = torch.full_like(mean, float("inf")).scatter_reduce_(0, inv, r, "amin")  # [G]
    degenerate = (cnt < 2) | (hi == lo)  # [G] singleton or exactly zero std
    adv = dev / (var.sqrt()[inv] + eps)  # [N]
    adv = torch.where(degenerate[inv], torch.zeros_like(adv), adv)  # [N]
    return adv.to(out_dtype)  # [N]


def peer_baseline_advantages(rewards: Tensor, group_ids: Tensor, untrusted: Tensor, weight: float) -> Tensor:
    """group_advantages, except that untrusted rows set the baseline of the other rows of their group only with
    `weight` (1: the paper's merged group; 0: those rows' mean and std come from the trusted rows alone); the
    untrusted rows keep the merged group's. Horizontal mode merges a peer's group into ours per prompt: with
    `teach_only` alone, a peer's correct rows, even ones too implausible to train, made each of our wrong
    completions of that prompt ~-1 (red team 25: -6.7 points held out). Vertical groups are wholly one or the
    other: unchanged."""
    if untrusted.shape != rewards.shape:
        raise ValueError(f"untrusted must be [N]={tuple(rewards.shape)}, got {tuple(untrusted.shape)}")
    merged = group_advantages(rewards, group_ids)  # [N]
    if weight == 1 or not bool(untrusted.any()):
        return merged
    apart = group_advantages(rewards, group_ids.long() * 2 + untrusted.long())  # [N] untrusted rows a group apart
    return torch.where(untrusted, merged, weight * merged + (1 - weight) * apart)  # [N]


def teach_only(advantages: Tensor, untrusted: Tensor, weight: float, cap: float | None = None) -> Tensor:
    """A_i scaled by `weight` where `untrusted` (bool [N]) and A_i < 0, and at most `cap` there
    (None: uncapped); unchanged elsewhere."""
    if untrusted.shape != advantages.shape:
        raise ValueError(f"untrusted must be [N]={tuple(advantages.shape)}, got {tuple(untrusted.shape)}")
    scaled = advantages * weight  # [N]
    if cap is not None:
        scaled = torch.where(advantages > 0, advantages.clamp(max=cap), scaled)  # [N]
    return torch.where(untrusted & ((advantages < 0) | (cap is not None)), scaled, advantages)  # [N]


def implausible(logp: Tensor, mask: Tensor, mean_floor: float, token_floor: float = -float("inf")) -> Tensor:
    """bool [B]: sequences whose mean per-token log-prob under the policy is below `mean_floor`, or
    any of whose tokens is below `token_floor` (empty sequences: False)."""
    m = mask != 0  # [B, T]
    n = m.sum(-1)  # [B]
    lp = logp.detach()  # [B, T]
    mean = torch.where(m, lp, torch.zeros_like(lp)).sum(-1) / n.clamp(min=1)  # [B]
    worst = torch.where(m, lp, torch.full_like(lp, float("inf"))).amin(-1) if lp.numel() else mean  # [B]
    return (n > 0) & ((mean < mean_floor) | (worst < token_floor))  # [B]


def sequence_divergence(logp: Tensor, gen_logp: Tensor, mask: Tensor, estimator: str = "k3", reduce: str = "sum") -> Tensor:
    """D_i from the sampled tokens (see module docstring); detached, 0 for empty sequences."""
    m = mask != 0  # [B, T]
    x = torch.where(m, gen_logp.detach() - logp.detach(), torch.zeros_like(logp))  # [B, T] log pi_gen/pi_theta
    x = x.clamp(-LOG_CLAMP, LOG_CLAMP)  # [B, T]
    if estimator == "k1":
        k = x  # [B, T]
    elif estimator == "k2":
        k = 0.5 * x * x  # [B, T]
    elif estimator == "k3":
        k = torch.expm1(x) - x  # [B, T] e^x - 1 - x, accurate near 0
    else:
        raise ValueError(f"unknown kl_estimator {estimator!r}; valid: {list(KL_ESTIMATORS)}")
    D = torch.where(m, k, torch.zeros_like(k)).sum(-1)  # [B]
    if reduce == "mean":
        D = D / m.sum(-1).clamp(min=1).to(D.dtype)  # [B]
    elif reduce != "sum":
        raise ValueError(f"unknown kl_reduce {reduce!r}; valid: {list(KL_REDUCES)}")
    return D  # [B]


def policy_loss(logp: Tensor, gen_logp: Tensor, advantages: Tensor, mask: Tensor, *, variant: str, eps: float,
                C: float, g: float, kl_estimator: str, kl_reduce: str, C_negative: float | None, positive_floor: float,
                check_certain_claims: bool) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to minimise and a dict of python-float stats (keys: STAT_KEYS). The settings are
    config.LossConfig's (C_negative None: C), described in the module docstring."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {sorted(VARIANTS)}")
    base, filtered = VARIANTS[variant]
    if logp.dim() != 2 or gen_logp.shape != logp.shape or mask.shape != logp.shape:
        raise ValueError(f"logp, gen_logp, mask must all be [B, T]; got {tuple(logp.shape)}, {tuple(gen_logp.shape)}, {tuple(mask.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be [B]={tuple(logp.shape[:1])}, got {tuple(advantages.shape)}")
    B = logp.shape[0]
    m = mask != 0  # [B, T] completion tokens
    mf = m.to(logp.dtype)  # [B, T]
    n_tok = mf.sum(-1)  # [B] |a_i|
    logp = torch.where(m, logp, torch.zeros_like(logp))  # [B, T] padding -> 0 (grad 0 there)
    gen = torch.where(m, gen_logp.detach(), torch.zeros_like(logp)).to(logp.dtype)  # [B, T]
    adv = advantages.detach().to(logp.dtype)  # [B]

    # plausibility: a multi-token completion claimed certain (every gen log-prob exactly 0) -> on-policy
    certain = torch.zeros_like(m[:, 0])  # [B]
    if check_certain_claims:
        certain = (n_tok >= 2) & ((gen == 0) & m).sum(-1).eq(n_tok)  # [B]
    gen = torch.where(certain[:, None], logp.detach(), gen)  # [B, T]

    # filter: zero non-positive advantages of sequences too far from the generator
    D = sequence_divergence(logp, gen, m, kl_estimator, kl_reduce)  # [B]
    dropped = (adv < 0) & (D >= g) if filtered else torch.zeros_like(m[:, 0])  # [B] (A_i == 0: no-op)
    adv = torch.where(dropped, torch.zeros_like(adv), adv)  # [B]

    # ratios: value-clamped log-ratio, gradient d/dlogp via the live (logp - sg(logp)) part
    log_is = (logp.detach() - gen).clamp(-LOG_CLAMP, LOG_CLAMP)  # [B, T] log pi_theta/pi_gen, no grad
    is_ratio = log_is.exp()  # [B, T] pi_theta/pi_gen, no grad
    live = logp - logp.detach()  # [B, T] 0 in value, d/dlogp = 1
    R = torch.exp(log_is + live) if base == "vis" else torch.exp(live)  # [B, T]
    unclipped = R * adv[:, None]  # [B, T]
    clipped = R.clamp(1 - eps, 1 + eps) * adv[:, None]  # [B, T]
    term = torch.minimum(unclipped, clipped)  # [B, T]
    if base == "tis":
        c_neg = C if C_negative is None else C_negative
        cap = torch.where(adv < 0, torch.full_like(adv, c_neg), torch.full_like(adv, C))  # [B] per-sign cap
        floor = torch.where(adv > 0, torch.full_like(adv, positive_floor), torch.zeros_like(adv))  # [B]
        term = term * torch.minimum(is_ratio, cap[:, None]).maximum(floor[:, None])  # [B, T] detached truncated weight
    per_seq = (term * mf).sum(-1) / n_tok.clamp(min=1)  # [B]
    loss = -per_seq.sum() / max(B, 1)  # []

    with torch.no_grad():  # stats over completion tokens only, one device sync
        n_all = mf.sum().clamp(min=1)  # []
        any_tok = m.any()  # []
        one = torch.ones((), dtype=logp.dtype, device=logp.device)  # []
        r_min = torch.where(m, is_ratio, torch.full_like(is_ratio, float("inf"))).flatten().amin() if m.numel() else one  # []
        r_max = torch.where(m, is_ratio, torch.zeros_like(is_ratio)).flatten().amax() if m.numel() else one  # []
        has = n_tok > 0  # [B]
        stats = torch.stack([
            torch.where(any_tok, (is_ratio * mf).sum() / n_all, one),  # []
            torch.where(any_tok, r_min, one),  # []
            torch.where(any_tok, r_max, one),  # []
            ((is_ratio > C) & m).sum() / n_all,  # []
            dropped.sum() / max(B, 1),  # []
            (D * has).sum() / has.sum().clamp(min=1),  # [] over non-empty sequences
            ((clipped < unclipped) & m).sum() / n_all,  # []
            loss.detach(),  # []
            certain.sum() / max(B, 1),  # []
        ]).tolist()
    return loss, dict(zip(STAT_KEYS, stats))

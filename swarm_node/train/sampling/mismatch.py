r"""Generator/trainer mismatch on the node's own samples: do the sampler's log-probs match the trainer's?

A sampler reports gen_logp for every token it drew; the trainer recomputes logp for the same
tokens with the same weights and temperature. With the HF sampler both come from one model and
the ratio is 1 up to float rounding; with vLLM (other kernels, a copy of the weights, bf16 on
GPUs) the node's own samples are no longer exactly on-policy, which is the paper's own reason
for truncated importance sampling. Logged every round, these say how far off they are:

    d_it = logp_it - gen_it                      on completion tokens (m_it = 1)
    sampling/sampling_logp_difference/mean|max   mean / max of |d_it|
    sampling/importance_sampling_ratio/min|mean|max   of exp(d_it) (clamped like loss.py)

Names are TRL's (GRPOTrainer logs the same quantities for its vLLM generations).
"""

from __future__ import annotations

import torch
from torch import Tensor

from swarm_node.train.policy import Policy
from swarm_node.wire.codec import Group
from swarm_node.train.loss import LOG_CLAMP

LOGP_DIFF_MEAN = "sampling/sampling_logp_difference/mean"
LOGP_DIFF_MAX = "sampling/sampling_logp_difference/max"
RATIO_MIN = "sampling/importance_sampling_ratio/min"
RATIO_MEAN = "sampling/importance_sampling_ratio/mean"
RATIO_MAX = "sampling/importance_sampling_ratio/max"


def mismatch_stats(logp: Tensor, gen_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """Stats of d = logp - gen_logp over tokens where `mask` is 1; logp, gen_logp, mask: [B, T].
    No completion tokens: differences 0 and ratios 1 (never NaN)."""
    keep = mask > 0  # [B, T]
    if not bool(keep.any()):
        return {LOGP_DIFF_MEAN: 0.0, LOGP_DIFF_MAX: 0.0, RATIO_MIN: 1.0, RATIO_MEAN: 1.0, RATIO_MAX: 1.0}
    diff = (logp.detach().float() - gen_logp.detach().float())[keep]  # [N] completion tokens only
    ratio = diff.clamp(-LOG_CLAMP, LOG_CLAMP).exp()  # [N]
    return {LOGP_DIFF_MEAN: float(diff.abs().mean()), LOGP_DIFF_MAX: float(diff.abs().max()),
            RATIO_MIN: float(ratio.min()), RATIO_MEAN: float(ratio.mean()), RATIO_MAX: float(ratio.max())}


@torch.no_grad()
def own_sample_mismatch(policy: Policy, groups: list[Group], temperature: float, micro_batch: int = 8,
                        chunk: int = 64) -> dict[str, float]:
    """Recompute the log-probs of `groups`' completions with `policy` (no grad, `micro_batch`
    sequences at a time) and compare them with the log-probs their sampler reported."""
    prompts = [g.prompt_tokens.tolist() for g in groups for _ in g.completions]
    completions = [c for g in groups for c in g.completions]
    logps, gens, masks = [], [], []
    for s in range(0, len(completions), micro_batch):
        batch = completions[s:s + micro_batch]
        logp, mask = policy.token_logprobs(prompts[s:s + micro_batch], [c.tokens.tolist() for c in batch],
                                           temperature, chunk)  # [b, T], [b, T]
        gen = torch.zeros_like(logp)  # [b, T]
        for row, c in enumerate(batch):
            gen[row, :len(c.logprobs)] = torch.from_numpy(c.logprobs.astype("float32")).to(gen.device)
        keep = mask > 0  # [b, T]
        logps.append(logp[keep])  # [n]
        gens.append(gen[keep])  # [n]
        masks.append(mask[keep])  # [n]
    if not logps:
        return mismatch_stats(torch.zeros(0, 0), torch.zeros(0, 0), torch.zeros(0, 0))
    return mismatch_stats(torch.cat(logps)[None], torch.cat(gens)[None], torch.cat(masks)[None])  # [1, N] each

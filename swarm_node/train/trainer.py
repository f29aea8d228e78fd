r"""Trainer: one optimizer step of the F-TIS objective over a round's TrainBatch (batch.py).

The batch is every completion of every group (own and peers'). Advantages are computed per
group (`loss.peer_baseline_advantages`: an untrusted peer's rows set no baseline of ours), then
sequences are processed in micro-batches whose losses are weighted by their share of the batch,
so the accumulated gradient equals the gradient of the paper's objective over the whole batch:
-(1/B) sum_i (1/|a_i|) sum_t term_it.

Sequences whose advantage is exactly zero (groups where every completion got the same reward)
contribute exactly zero loss and gradient under every variant, so they are not run through the
model at all: they still count in B, and `train/active_frac` reports the share that was run.
Stats are therefore computed over the active sequences.

Sampler/trainer mismatch. A sampler that is not the trained model itself (vLLM: other kernels, a
copy of the weights, bf16 on GPUs) reports gen_logp that differ from the trainer's logp for the
same tokens, weights and temperature, so the node's own samples are not exactly on-policy (the
paper's own reason for truncated importance sampling). With such a sampler the step also reports,
from its forward, over the own completions it ran (`mismatch_stats`; TRL's names):

    d_it = logp_it - gen_it                                on own completion tokens
    sampling/sampling_logp_difference/mean|max            mean / max of |d_it|
    sampling/importance_sampling_ratio/min|mean|max       of exp(d_it) (clamped like loss.py)

The trainer also owns the policy version: the number of optimizer steps taken, which the node
stamps on its packets so receivers know how stale a generator was.
"""

from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from swarm_node import metrics as M
from swarm_node.config import LossConfig, TrainConfig
from swarm_node.train.batch import TrainBatch
from swarm_node.train.loss import LOG_CLAMP, implausible, peer_baseline_advantages, policy_loss, teach_only
from swarm_node.train.policy import Policy

NO_BAR = (math.inf, math.inf)  # _plausibility_floors: no sample of ours yet to set the bar by
STEP_SLACK, LENGTH_SLACK = 1.25, 1.5  # _length_bound: this times our median correct; ceiling: 1.5x the first bound


def loss_settings(cfg: LossConfig) -> dict:
    """The keyword arguments of `loss.policy_loss` from the config's loss section (peer_* are the trainer's)."""
    return dict(variant=cfg.variant, eps=cfg.eps, C=cfg.C, g=cfg.g, kl_estimator=cfg.kl_estimator,
                kl_reduce=cfg.kl_reduce, C_negative=cfg.C_negative, positive_floor=cfg.positive_floor,
                check_certain_claims=cfg.check_certain_claims)


def mismatch_stats(diff: Tensor) -> dict[str, float]:
    """Stats of d = logp - gen_logp over the compared tokens, diff [n]; no tokens: 0 and 1 (never NaN)."""
    if diff.numel() == 0:
        return {M.MISMATCH_LOGP_DIFF_MEAN: 0.0, M.MISMATCH_LOGP_DIFF_MAX: 0.0, M.MISMATCH_RATIO_MIN: 1.0,
                M.MISMATCH_RATIO_MEAN: 1.0, M.MISMATCH_RATIO_MAX: 1.0}
    diff = diff.detach().float()  # [n]
    ratio = diff.clamp(-LOG_CLAMP, LOG_CLAMP).exp()  # [n]
    stats = torch.stack([diff.abs().mean(), diff.abs().max(), ratio.min(), ratio.mean(), ratio.max()]).tolist()
    return dict(zip((M.MISMATCH_LOGP_DIFF_MEAN, M.MISMATCH_LOGP_DIFF_MAX, M.MISMATCH_RATIO_MIN,
                     M.MISMATCH_RATIO_MEAN, M.MISMATCH_RATIO_MAX), stats))


def _merge_stats(acc: dict[str, float], stats: dict[str, float], weight: float) -> None:
    """Fold one micro-batch's stats into `acc`: max/min keys by max/min, the rest weighted means."""
    for key, value in stats.items():
        if key.endswith("_max"):
            acc[key] = max(acc.get(key, value), value)
        elif key.endswith("_min"):
            acc[key] = min(acc.get(key, value), value)
        else:
            acc[key] = acc.get(key, 0.0) + weight * value


class Trainer:
    """Holds the optimizer and the policy version; `step(batch)` is one update.

    `temperature`: the sampling temperature (log-probs are compared at it). `sampler_on_policy`:
    whether the sampler is the trained model itself (Sampler.on_policy); if not, every step also
    reports the mismatch of its log-probs on the node's own samples.
    """

    def __init__(self, policy: Policy, train: TrainConfig, loss: LossConfig, temperature: float,
                 sampler_on_policy: bool = True):
        assert train.lr is not None, "resolve the config's defaults first (swarm_node.train.defaults.resolve)"
        self.policy, self.train, self.loss, self.temperature = policy, train, loss, temperature
        self.sampler_on_policy = sampler_on_policy
        self.optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=train.lr, weight_decay=train.weight_decay)
        self.policy_version = 0
        self.first_floors: tuple[float, float] | None = None  # loss.implausible's anchor (first step)
        self.last_floors: tuple[float, float] | None = None  # the latest step's (a step without own samples uses them)
        self.first_length: float | None = None  # _length_bound's floor (set by our first correct completions)
        self.last_length = math.inf  # the latest step's (a step without a correct completion of ours uses it)
        self.implausible = torch.zeros(0, dtype=torch.bool)  # [N] last step: untrusted positives found implausible

    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on all rows of `batch`; returns the loss stats."""
        start = time.perf_counter()
        advantages = peer_baseline_advantages(batch.rewards, batch.group, batch.untrusted,
                                              self.loss.peer_negative_weight)  # [N]
        peer_negatives = float(((advantages < 0) & batch.untrusted).float().mean()) if len(batch) else 0.0
        advantages = teach_only(advantages, batch.untrusted, self.loss.peer_negative_weight,
                                self.loss.peer_max_advantage)  # [N]
        floors = self._plausibility_floors(batch)
        if floors == NO_BAR:  # no sample of ours yet to judge a peer's by: its positives teach nothing this step
            advantages, floors = torch.where(batch.untrusted, torch.zeros_like(advantages), advantages), None  # [N]
        too_long = batch.untrusted & (batch.rewards > 0) & (batch.lengths > self._length_bound(batch))  # [N]
        advantages = torch.where(too_long, torch.zeros_like(advantages), advantages)  # [N]
        active = ((advantages != 0) & (batch.lengths > 0)).nonzero().flatten()  # [n_active] rows run through the model
        total, n_active = len(batch), len(active)
        # [N] found implausible by the floors (the mesh credit reads it; a length over the bound alone does not count
        # there: an honest peer whose problems have longer answers must not lose its slot for it)
        self.implausible = torch.zeros(total, dtype=torch.bool)
        stats: dict[str, float] = {}
        own_diffs: list[Tensor] = []  # [k] per micro-batch: logp - gen_logp on own completion tokens
        settings = loss_settings(self.loss)
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for s in range(0, n_active, self.train.micro_batch):
            idx = active[s:s + self.train.micro_batch]  # [b]
            mb = batch.rows(idx)
            logp = self.policy.completion_logprobs(mb.ids, mb.attention, mb.prompt_len, mb.mask, self.temperature,
                                                   self.train.logprob_chunk)  # [b, T]
            mask, gen = mb.mask.to(logp.device), mb.gen_logp.to(logp.device)  # [b, T], [b, T]
            adv, peer, own = (x.to(logp.device) for x in (advantages[idx], mb.untrusted, mb.own))  # [b] each
            if not self.sampler_on_policy:
                own_diffs.append((logp.detach() - gen)[(mask > 0) & own[:, None]])  # [k]
            if self.loss.peer_plausibility_margin is not None:  # an untrusted peer's claims carry no weight
                gen = torch.where(peer[:, None], logp.detach(), gen)  # [b, T] its samples taken as on-policy
            if floors is not None:  # an untrusted peer's positive must be plausible under our policy
                drop = implausible(logp, mask, *floors) & peer & (adv > 0)  # [b]
                self.implausible[idx] = drop.cpu()
                adv = torch.where(drop, torch.zeros_like(adv), adv)  # [b]
            loss, mb_stats = policy_loss(logp, gen, adv, mask, **settings)
            (loss * len(idx) / total).backward()
            _merge_stats(stats, mb_stats, len(idx) / n_active)
        if floors is not None:  # untrusted positives the step did not run (advantage 0): judged, not trained
            self._judge_unrun(batch, advantages, floors)
        grad_norm = 0.0
        if n_active:
            params = self.policy.trainable_parameters()
            if self.train.max_grad_norm > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.train.max_grad_norm))
            self.optimizer.step()
            self.policy_version += 1
        self.optimizer.zero_grad(set_to_none=True)  # gradients are not kept through generation (memory)
        if any(d.numel() for d in own_diffs):  # no own token run: no figure this step
            stats.update(mismatch_stats(torch.cat(own_diffs)))
        stats.update({M.TRAIN_GROUPS: len(batch.group.unique()), M.TRAIN_SEQUENCES: total,
                      M.TRAIN_ACTIVE_FRAC: n_active / max(total, 1), M.TRAIN_GRAD_NORM: grad_norm,
                      M.TRAIN_POLICY_VERSION: self.policy_version, M.TRAIN_PEER_NEGATIVES: peer_negatives,
                      M.TRAIN_PEER_IMPLAUSIBLE: int((self.implausible | too_long).sum()) / max(total, 1),
                      M.TIME_TRAIN: time.perf_counter() - start})
        return stats

    @torch.no_grad()
    def _judge_unrun(self, batch: TrainBatch, advantages: Tensor, floors: tuple[float, float]) -> None:
        """Mark the untrusted positives of zero advantage (all-correct groups) that are implausible, so
        the mesh credit sees them too: an all-correct group teaches nothing and is never run, and a
        peer must not keep its neighbour slot with such groups of completions we would never write."""
        unrun = (batch.untrusted & (batch.rewards > 0) & (advantages == 0) & (batch.lengths > 0)).nonzero().flatten()
        for s in range(0, len(unrun), self.train.micro_batch):
            idx = unrun[s:s + self.train.micro_batch]  # [b]
            mb = batch.rows(idx)
            logp = self.policy.completion_logprobs(mb.ids, mb.attention, mb.prompt_len, mb.mask, self.temperature,
                                                   self.train.logprob_chunk)  # [b, T]
            self.implausible[idx] = implausible(logp, mb.mask.to(logp.device), *floors).cpu()  # [b]

    def _length_bound(self, batch: TrainBatch) -> float:
        """The most tokens an untrusted peer's positive may have to teach this step (inf: no check, or no correct
        completion of ours yet to measure by): STEP_SLACK times the median length of our correct completions in the
        step (a peer's problems may have longer answers than ours), at most LENGTH_SLACK times that bound at the
        first step that had one (or our own median, if longer), and never below the first step's. A peer's correct
        completions padded to the completion limit are likely enough on a real model (red team 27: SmolLM2
        restating the question, 21-24 tokens where it writes 15, passed the floors in its first steps) and teach
        the node to write longer, which no accuracy check sees: it may teach what we write when right, not much
        more of it. The median, not the longest: our longest correct completion of a step reached the 24-token
        limit on SmolLM2 by itself, and a bound over the limit bounds nothing (red team 28). The ceiling stops a
        ratchet (positives at our own length make it longer); the floor stops a peer that teaches short answers
        from shutting out honest peers' longer ones (review, session 36). A step without a correct completion of
        ours keeps the latest bound."""
        if self.loss.peer_plausibility_margin is None:
            return math.inf
        right = ~batch.untrusted & (batch.lengths > 0) & (batch.rewards > 0)  # [N] own and trusted, correct
        if bool(right.any()):
            typical = float(batch.lengths[right].float().median())
            self.first_length = self.first_length or STEP_SLACK * typical
            ceiling = max(LENGTH_SLACK * self.first_length, typical)
            self.last_length = max(self.first_length, min(STEP_SLACK * typical, ceiling))
        return self.last_length

    def _plausibility_floors(self, batch: TrainBatch) -> tuple[float, float] | None:
        """(F_mean, F_token) of loss.implausible for this step, anchored at their first values
        (None: no check, or no untrusted sample in the step). A step without a sample of ours (its
        own prompts were all in the guard's reserve) keeps the latest step's, NO_BAR before any."""
        margin = self.loss.peer_plausibility_margin
        lengths = batch.lengths  # [N]
        mine = ~batch.untrusted & (lengths > 0)  # [N] own and trusted samples
        if margin is None:
            return None
        if bool(mine.any()):
            gen, m = batch.gen_logp[mine], batch.mask[mine] > 0  # [k, T], [k, T]
            mean = (gen * m).sum(-1) / lengths[mine]  # [k] mean claimed log-prob per sample
            worst = torch.where(m, gen, torch.full_like(gen, float("inf"))).amin(-1)  # [k] worst claimed token
            floors = (float(torch.quantile(mean, 0.05)) - margin, float(torch.quantile(worst, 0.05)) - margin)
            self.first_floors = self.first_floors or floors  # what the node wrote before any peer taught it
            self.last_floors = (max(floors[0], self.first_floors[0]), max(floors[1], self.first_floors[1]))
        if not bool(batch.untrusted.any()):
            return None
        return self.last_floors or NO_BAR

"""Trainer: one optimizer step of the F-TIS objective over a round's merged groups.

The batch is every completion of every group (own and peers'). Advantages are computed per
group (`loss.group_advantages`), then sequences are processed in micro-batches whose losses are
weighted by their share of the batch, so the accumulated gradient equals the gradient of the
paper's objective over the whole batch: -(1/B) sum_i (1/|a_i|) sum_t term_it.

Sequences whose advantage is exactly zero (groups where every completion got the same reward)
contribute exactly zero loss and gradient under every variant, so they are not run through the
model at all: they still count in B, and `train/active_frac` reports the share that was run.
Stats are therefore computed over the active sequences.

The trainer also owns the policy version: the number of optimizer steps taken, which the node
stamps on its packets so receivers know how stale a generator was.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from swarm_node import metrics as M
from swarm_node.train.policy import Policy
from swarm_node.wire.codec import Group
from swarm_node.config import LossConfig, TrainConfig
from swarm_node.train.loss import group_advantages, implausible, policy_loss, teach_only


def loss_settings(cfg: LossConfig) -> dict:
    """The keyword arguments of `loss.policy_loss` from the config's loss section (peer_* are the trainer's)."""
    return dict(variant=cfg.variant, eps=cfg.eps, C=cfg.C, g=cfg.g, kl_estimator=cfg.kl_estimator,
                kl_reduce=cfg.kl_reduce, C_negative=cfg.C_negative, positive_floor=cfg.positive_floor,
                check_certain_claims=cfg.check_certain_claims)


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
    """Holds the optimizer and the policy version; `step(groups)` is one update. `temperature`:
    the sampling temperature (log-probs are compared at it)."""

    def __init__(self, policy: Policy, train: TrainConfig, loss: LossConfig, temperature: float):
        assert train.lr is not None, "resolve the config's defaults first (swarm_node.train.defaults.resolve)"
        self.policy, self.train, self.loss, self.temperature = policy, train, loss, temperature
        self.optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=train.lr, weight_decay=train.weight_decay)
        self.policy_version = 0
        self.first_floors: tuple[float, float] | None = None  # loss.implausible's anchor (first step)

    def step(self, groups: list[Group], untrusted: list[bool] | None = None) -> dict[str, float]:
        """One optimizer step on all completions of `groups`; returns the loss stats. `untrusted`:
        per completion (in order), whether an untrusted peer sent it (`loss.teach_only`)."""
        start = time.perf_counter()
        prompts = [g.prompt_tokens.tolist() for g in groups for _ in g.completions]
        completions = [c.tokens.tolist() for g in groups for c in g.completions]
        gen_logps = [c.logprobs for g in groups for c in g.completions]
        rewards = torch.tensor([c.reward for g in groups for c in g.completions], dtype=torch.float32)  # [N]
        group_ids = torch.tensor([k for k, g in enumerate(groups) for _ in g.completions])  # [N]
        advantages = group_advantages(rewards, group_ids)  # [N]
        from_untrusted = torch.tensor(untrusted if untrusted is not None else [False] * len(rewards), dtype=torch.bool)  # [N]
        peer_negatives = float(((advantages < 0) & from_untrusted).float().mean()) if len(rewards) else 0.0
        advantages = teach_only(advantages, from_untrusted, self.loss.peer_negative_weight)  # [N]
        floors = self._plausibility_floors(gen_logps, from_untrusted)
        n_implausible = 0
        active = [i for i in range(len(completions)) if advantages[i] != 0 and len(completions[i]) > 0]
        total = len(completions)
        stats: dict[str, float] = {}
        self.policy.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        micro = self.train.micro_batch
        for s in range(0, len(active), micro):
            idx = active[s:s + micro]
            logp, mask = self.policy.token_logprobs([prompts[i] for i in idx], [completions[i] for i in idx],
                                                    self.temperature, self.train.logprob_chunk)  # [b, T], [b, T]
            gen = torch.zeros_like(logp)  # [b, T]
            for row, i in enumerate(idx):
                gen[row, :len(gen_logps[i])] = torch.from_numpy(gen_logps[i].astype("float32"))
            adv = advantages[idx].to(logp.device)  # [b]
            peer = from_untrusted[idx].to(logp.device)  # [b]
            if self.loss.peer_plausibility_margin is not None:  # an untrusted peer's claims carry no weight
                gen = torch.where(peer[:, None], logp.detach(), gen)  # [b, T] its samples taken as on-policy
            if floors is not None:  # an untrusted peer's positive must be plausible under our policy
                drop = implausible(logp, mask, *floors) & peer & (adv > 0)  # [b]
                n_implausible += int(drop.sum())
                adv = torch.where(drop, torch.zeros_like(adv), adv)  # [b]
            loss, mb_stats = policy_loss(logp, gen, adv, mask, **loss_settings(self.loss))
            (loss * len(idx) / total).backward()
            _merge_stats(stats, mb_stats, len(idx) / len(active))
        grad_norm = 0.0
        if active:
            params = self.policy.trainable_parameters()
            if self.train.max_grad_norm > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.train.max_grad_norm))
            self.optimizer.step()
            self.policy_version += 1
        self.optimizer.zero_grad(set_to_none=True)  # gradients are not kept through generation (memory)
        stats.update({M.TRAIN_GROUPS: len(groups), M.TRAIN_SEQUENCES: total, M.TRAIN_ACTIVE_FRAC: len(active) / max(total, 1),
                      M.TRAIN_GRAD_NORM: grad_norm, M.TRAIN_POLICY_VERSION: self.policy_version,
                      M.TRAIN_PEER_NEGATIVES: peer_negatives, M.TRAIN_PEER_IMPLAUSIBLE: n_implausible / max(total, 1),
                      M.TIME_TRAIN: time.perf_counter() - start})
        return stats

    def _plausibility_floors(self, gen_logps: list, untrusted: torch.Tensor) -> tuple[float, float] | None:
        """(F_mean, F_token) of loss.implausible for this step, anchored at their first values
        (None: no check, or no untrusted sample in the step)."""
        margin = self.loss.peer_plausibility_margin
        own = [lp for lp, u in zip(gen_logps, untrusted.tolist()) if not u and len(lp)]
        if margin is None or not own:
            return None
        floors = (float(np.percentile([lp.mean() for lp in own], 5)) - margin,
                  float(np.percentile([lp.min() for lp in own], 5)) - margin)
        self.first_floors = self.first_floors or floors  # what the node wrote before any peer taught it
        floors = (max(floors[0], self.first_floors[0]), max(floors[1], self.first_floors[1]))
        return floors if bool(untrusted.any()) else None

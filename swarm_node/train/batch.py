"""TrainBatch: one step's completions as padded tensors, built once from the combined groups.

Every completion of every group is one row: its prompt, then its tokens, right-padded.

    ids         [N, L]  prompt tokens, completion tokens, then pad_id   (L: longest prompt + completion)
    attention   [N, L]  1 on prompt and completion tokens
    prompt_len  [N]     P_i: the hidden state at position P_i - 1 predicts the first completion token
    mask        [N, T]  1.0 on completion tokens                         (T: longest completion, >= 1)
    gen_logp    [N, T]  the generator's log-probs of those tokens, 0 on padding
    rewards     [N]     the task's reward of each completion
    group       [N]     index of its group (advantages are normalised per group)
    own         [N]     sampled by this node's own sampler
    untrusted   [N]     sent by a peer outside swarm.trusted_peers (loss.teach_only, loss.implausible)

Groups hold the wire's numpy arrays (codec.Group); this is their one conversion to tensors. The
batch stays on the CPU; a micro-batch is `rows(index)`, trimmed to its own longest row, and goes
to the model's device in `Policy.completion_logprobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from swarm_node.wire.codec import Group


def pad(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]],
        pad_id: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rows of prompt then completion, right-padded: ids [B, L], attention [B, L], prompt_len [B], mask [B, T]."""
    p_len = np.array([len(p) for p in prompts], dtype=np.int64)  # [B]
    c_len = np.array([len(c) for c in completions], dtype=np.int64)  # [B]
    L, T = int((p_len + c_len).max(initial=0)), max(1, int(c_len.max(initial=0)))
    ids = np.full((len(p_len), L), pad_id, dtype=np.int64)  # [B, L]
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, :p_len[i]] = p
        ids[i, p_len[i]:p_len[i] + c_len[i]] = c
    attention = np.arange(L) < (p_len + c_len)[:, None]  # [B, L]
    mask = np.arange(T) < c_len[:, None]  # [B, T]
    return (torch.from_numpy(ids), torch.from_numpy(attention).long(), torch.from_numpy(p_len),
            torch.from_numpy(mask).float())


@dataclass(frozen=True)
class TrainBatch:
    ids: Tensor  # [N, L] long
    attention: Tensor  # [N, L] long
    prompt_len: Tensor  # [N] long
    mask: Tensor  # [N, T] float32
    gen_logp: Tensor  # [N, T] float32
    rewards: Tensor  # [N] float32
    group: Tensor  # [N] long
    own: Tensor  # [N] bool
    untrusted: Tensor  # [N] bool

    @classmethod
    def from_groups(cls, groups: list[Group], pad_id: int, own: Sequence[bool] | None = None,
                    untrusted: Sequence[bool] | None = None) -> TrainBatch:
        """All completions of `groups`, in order; `own` / `untrusted`: one flag per completion (None: all False)."""
        completions = [c for g in groups for c in g.completions]
        ids, attention, prompt_len, mask = pad([g.prompt_tokens for g in groups for _ in g.completions],
                                               [c.tokens for c in completions], pad_id)
        gen_logp = np.zeros(tuple(mask.shape), dtype=np.float32)  # [N, T]
        for i, c in enumerate(completions):
            gen_logp[i, :len(c.logprobs)] = c.logprobs
        N = len(completions)
        return cls(ids, attention, prompt_len, mask, torch.from_numpy(gen_logp),
                   rewards=torch.tensor([c.reward for c in completions], dtype=torch.float32),  # [N]
                   group=torch.tensor([k for k, g in enumerate(groups) for _ in g.completions], dtype=torch.long),  # [N]
                   own=torch.tensor([False] * N if own is None else list(own), dtype=torch.bool),  # [N]
                   untrusted=torch.tensor([False] * N if untrusted is None else list(untrusted), dtype=torch.bool))  # [N]

    def __len__(self) -> int:
        return self.rewards.shape[0]

    @property
    def lengths(self) -> Tensor:
        """Completion lengths |a_i|, [N] long."""
        return self.mask.sum(-1).long()  # [N]

    def in_signal_group(self) -> Tensor:
        """[N] bool: the row's group holds rewards that differ (only such a group has advantages)."""
        lo = torch.full((int(self.group.max()) + 1 if len(self) else 0,), float("inf")).scatter_reduce(
            0, self.group, self.rewards, "amin")  # [G]
        hi = torch.full_like(lo, -float("inf")).scatter_reduce(0, self.group, self.rewards, "amax")  # [G]
        return (hi > lo)[self.group]  # [N]

    def rows(self, index: Tensor) -> TrainBatch:
        """The rows `index` [b] (not empty), trimmed to their longest sequence and completion."""
        width = int(self.attention[index].sum(-1).max())
        T = max(1, int(self.lengths[index].max()))
        return TrainBatch(self.ids[index, :width], self.attention[index, :width], self.prompt_len[index],
                          self.mask[index, :T], self.gen_logp[index, :T], self.rewards[index], self.group[index],
                          self.own[index], self.untrusted[index])

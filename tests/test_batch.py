"""TrainBatch: the combined groups as padded tensors, built once; micro-batches are trimmed rows."""

import numpy as np
import torch

from swarm_node.train.batch import TrainBatch
from swarm_node.wire.codec import Completion, Group

P = 0  # pad id


def _completion(tokens: list[int], reward: float = 0.0) -> Completion:
    logprobs = np.asarray([-0.5 - t / 10 for t in range(len(tokens))], np.float32)
    return Completion(np.asarray(tokens, np.uint32), logprobs, "stop", reward)


def _groups() -> list[Group]:
    return [Group("arith", "train/1", np.asarray([5, 6], np.uint32), [_completion([7, 8, 9], 1.0), _completion([7])]),
            Group("arith", "train/2", np.asarray([4, 4, 4, 4], np.uint32), [_completion([])])]


def test_rows_are_prompt_then_completion_right_padded():
    batch = TrainBatch.from_groups(_groups(), P, own=[True, True, False], untrusted=[False, False, True])
    assert batch.ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, P, P], [4, 4, 4, 4, P]]
    assert batch.attention.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]
    assert batch.prompt_len.tolist() == [2, 2, 4] and batch.lengths.tolist() == [3, 1, 0]
    assert batch.mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]] and batch.mask.dtype == torch.float32
    assert torch.allclose(batch.gen_logp, torch.tensor([[-0.5, -0.6, -0.7], [-0.5, 0, 0], [0, 0, 0]]))
    assert batch.rewards.tolist() == [1.0, 0.0, 0.0] and batch.group.tolist() == [0, 0, 1]
    assert batch.own.tolist() == [True, True, False] and batch.untrusted.tolist() == [False, False, True]
    assert len(batch) == 3
    plain = TrainBatch.from_groups(_groups(), P)
    assert not plain.own.any() and not plain.untrusted.any()


def test_a_micro_batch_is_trimmed_to_its_own_longest_row():
    batch = TrainBatch.from_groups(_groups(), P, untrusted=[False, False, True])
    short = batch.rows(torch.tensor([1]))
    assert short.ids.tolist() == [[5, 6, 7]] and short.mask.tolist() == [[1.0]] and short.gen_logp.shape == (1, 1)
    empty = batch.rows(torch.tensor([2]))  # no completion token: one masked slot
    assert empty.ids.tolist() == [[4, 4, 4, 4]] and empty.mask.tolist() == [[0.0]] and empty.untrusted.tolist() == [True]


def test_the_batch_scores_as_token_lists_do(tiny_policy):
    groups = _groups()[:1]
    batch = TrainBatch.from_groups(groups, tiny_policy.pad_id)
    with torch.no_grad():
        logp = tiny_policy.completion_logprobs(batch.ids, batch.attention, batch.prompt_len, batch.mask, 0.7, chunk=2)
        ref, mask = tiny_policy.token_logprobs([[5, 6], [5, 6]], [[7, 8, 9], [7]], 0.7, chunk=2)
    assert torch.equal(mask, batch.mask) and torch.allclose(logp, ref, atol=1e-6)
    assert (logp[1, 1:] == 0).all()  # padding scores 0


def test_in_signal_group_marks_the_rows_of_groups_whose_rewards_differ():
    batch = TrainBatch.from_groups(_groups(), P)
    assert batch.in_signal_group().tolist() == [True, True, False]  # group 2 has one completion: no spread
    assert TrainBatch.from_groups([], P).in_signal_group().tolist() == []

"""Reserve: train problems a node keeps secret and never trains on, so the guard measures skill, not recall.

The guard (train/guard.py) compares the trained model with its alone copy on train problems. If
those were problems either had trained on, a peer could teach the trained model the answers of
many train problems (correct, plausible completions: every per-sample check passes) while
un-teaching the skill: the check would see recall and miss the harm. Measured before the reserve
(`bench/redteam_matrix.py`, `skew`: 2 ids sending only train problems whose answer ends in 0,
3 seeds, Intel Xeon): the victim's gap between the guard's train problems and held-out ones grew
from 7.8 points (no attack) to 13.2; on train problems it stayed level with its alone copy while
held out it lost 12 points to the no-attack run.

So a share of the train *problems* (arith repeats each of its 1,752 problems about 57 times in
100,000 examples) is reserved by a keyed hash whose key is drawn from the OS and never leaves the
node:

    reserved(example)   keyed BLAKE2b of the task's problem key < share: kept for the checks (the
                        key names a problem's twins alike, Task.problem_key: "3 plus 5" and
                        "5 plus 3" are reserved together, so one cannot teach the other's answer)
    the node            draws, answers and offers its prompts as if there were no reserve, and
                        leaves the groups on reserved problems out of its own step; peers' groups
                        on them are dropped before the buffer
    next_slice(n)       the next n reserved problems of a secret shuffled order: consecutive
                        checks share no problem until the reserve is used up, so a pooled window
                        holds distinct problems (the verdict's standard deviation assumes that)

A peer cannot tell which problems are reserved: the node's offers are drawn from all problems alike,
and a peer's reserved group counts as teaching for the mesh's credit (node.py), so whether the node
waits for it next round shows nothing either. Before (session 23) its prompts avoided the reserve,
and the problems a node never offered in a long run were the reserve (arith, 16 prompts a round:
44 % of the problems a node had not offered after 100 rounds were reserved, 89 % after 300, against
20 % a priori). The cost: about `share` of a node's own groups are answered for the peers only. A
peer's groups on a reserved problem are simply not trained on. The warm start saw every train
problem, reserved or not: both copies start from it, so it shifts both alike.
"""

from __future__ import annotations

import hashlib
import random

from swarm_node.tasks import Example, Task

PLATEAU = 20_000  # examples scanned without a new problem: the rest of the split repeats them


class Reserve:
    """The reserved problems of `task`'s train split: a secret `share` of them."""

    def __init__(self, task: Task, share: float, key: bytes | None = None, limit: int | None = None):
        """`limit`: the checks need at most this many problems; the scan of the split stops there."""
        self.task, self.share, self.limit = task, share, limit
        self.key = key if key is not None else random.SystemRandom().getrandbits(128).to_bytes(16, "big")
        self.pool = self._pool()  # train indices, one per reserved problem
        self.order = random.Random(random.SystemRandom().getrandbits(64)).sample(self.pool, len(self.pool))  # secret
        self.cursor = 0

    def reserved(self, example: Example) -> bool:
        """Whether `example`'s problem is kept for the checks (never trained on)."""
        return self._reserved_problem(self.task.problem_key(example))

    def _reserved_problem(self, problem: str) -> bool:
        """Whether the problem with key `problem` (Task.problem_key) is reserved: keyed BLAKE2b < share."""
        digest = hashlib.blake2b(problem.encode("utf-8"), key=self.key, digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.share * 2**64

    def holds(self, example_id: str) -> bool:
        """Whether the train example `example_id` (a peer's group names it) is a reserved problem."""
        example = self.task.example(example_id)
        return example is not None and self.reserved(example)

    def next_slice(self, n: int) -> list[Example]:
        """The next `n` reserved problems of one secret order, read cyclically: with n at most a third
        of the reserve, any 3 consecutive slices hold distinct problems."""
        n = min(n, len(self.order))
        train = self.task.split("train")
        chosen = [self.order[(self.cursor + k) % len(self.order)] for k in range(n)]
        self.cursor = (self.cursor + n) % len(self.order)
        return [train[i] for i in chosen]

    def trainable(self, groups: list) -> list:
        """The groups not on a reserved problem (the others are never trained on, whoever sent them)."""
        return [g for g in groups if not self.holds(g.example_id)]

    def _pool(self) -> list[int]:
        """One train index per reserved problem. A generated split repeats a small problem space (arith:
        every problem within its first ~25,000 examples), so the scan stops after PLATEAU examples
        with no new problem."""
        train, seen, first, last_new = self.task.split("train"), set(), {}, 0
        for i in range(len(train)):
            if i - last_new > PLATEAU or self.limit is not None and len(first) >= self.limit:
                break
            example = train[i]
            problem = self.task.problem_key(example)
            if problem not in seen:
                seen.add(problem)
                last_new = i
                if self._reserved_problem(problem):  # the key computed once
                    first[problem] = i
        return list(first.values())

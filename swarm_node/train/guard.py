r"""Guard: peers' data may make this node better, never measurably worse than its own data alone.

Per-sample checks (admission, loss.teach_only, loss.implausible) bound what one packet can teach;
they cannot see *which* correct, plausible completions a peer chooses to send, and ids are free, so
k Sybils choosing them hold k/(k+1) of a step's peer slots (docs/RELIABILITY.md). The guard
measures what the peers' data did instead, against a reference no peer touches:

    mixed   the trained weights: own groups + peers' groups (what the node samples with and offers)
    alone   a copy trained on the same rounds' own groups only (same objective, its own optimizer)

Every `swarm.guard_every` rounds (and after the last) both answer a private slice of the train
split greedily (`swarm.guard_examples` examples drawn with a secret seed, or `train.seed`'s: no
peer knows which). With n examples, b = solved by alone only, c = solved by mixed only (a paired
comparison: McNemar's discordant pairs), and the bar max(guard_margin * n, 2 sqrt(b + c)) (two
standard deviations of b - c when the two are equally good), in 2 of the last 3 checks (the gap
of two equally good models swings past the bar now and then, measured: -0.14 to +0.13 within one
honest run of 100 rounds; a harm persists, though un-taught models swing too: a poisoned run's gap
read 0.09, 0.04, 0.11, 0.03, 0.13 against a bar of 0.05, never twice in a row):

    b - c > bar   harm: mixed <- alone (weights and optimizer state); every untrusted peer whose
                  groups with signal were trained on since the two last agreed is distrusted
                  (no packet of it admitted, nobody waits for it) for guard_ban_rounds, doubled
                  at each offence, except a vouched one: it is forgiven once and loses the
                  vouching; and for as long (doubled at each harm) only vouched and forgiven
                  peers teach (a lockdown): ids are free, and 64 Sybil ids would otherwise take
                  turns, each new batch of them un-teaching the node again until the next verdict
    c - b > bar   help: alone <- mixed (the reference moves up only by a measured gain); the
                  peers that taught mixed since the two last agreed are vouched for
    otherwise     nothing

The bound, in plain words: the node is never, in 2 of 3 checks in a row, more than the bar behind a
copy of itself that learned from its own groups only, on a slice no peer knows; a peer (or any
number of Sybil ids) can cost it at most that plus what the rounds of two checks taught, and its
ids are not trained on again, for longer each time. What it cannot stop: harm smaller than
the bar, and a bad window costs the honest peers trained on in it their turn (collateral: the node
then learns alone until their bans end). Cost: a second copy of the trainable weights and optimizer
state, a second training step on the own groups each round, and 2 n greedy answers per check.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import time
from dataclasses import dataclass, field

import torch

from swarm_node import metrics as M
from swarm_node.tasks import Example, Task
from swarm_node.train.batch import TrainBatch
from swarm_node.train.evaluate import solved
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.train.trainer import Trainer

log = logging.getLogger(__name__)
Z = 2.0  # standard deviations of the paired difference a verdict needs
CONFIRM, WINDOW = 2, 3  # a verdict needs 2 of the last 3 checks: the gap swings between checks, a harm persists
MAX_BAN_ROUNDS = 10_000  # a ban doubles per offence up to this


def private_slice(task: Task, n: int, seed: int | None) -> list[Example]:
    """`n` train examples drawn with `seed` (None: a secret one, never logged)."""
    train = task.split("train")
    rng = random.Random(seed if seed is not None else random.SystemRandom().getrandbits(64))
    return [train[i] for i in rng.sample(range(len(train)), min(n, len(train)))]


@dataclass
class Verdict:
    """What a check found: its metrics; peers not to train on until their rounds; and, after a
    harm, the round until which only `admitted` peers may teach (0: no lockdown)."""

    stats: dict
    distrusted: dict[str, int] = field(default_factory=dict)
    locked_until: int = 0
    admitted: frozenset[str] = frozenset()


class Guard:
    """The alone reference and its verdicts; `step` after every training step, `check` when due."""

    def __init__(self, trainer: Trainer, shadow: Trainer, task: Task, examples: list[Example], max_new_tokens: int,
                 margin: float, ban_rounds: int):
        """`trainer`: the mixed weights' (its policy holds them); `shadow`: a second Trainer of the same policy."""
        self.policy, self.trainer, self.shadow, self.task, self.examples = trainer.policy, trainer, shadow, task, examples
        self.max_new_tokens, self.margin, self.ban_rounds = max_new_tokens, margin, ban_rounds
        self.params = self.policy.trainable_parameters()
        self.alone = [p.detach().clone() for p in self.params]  # the reference's weights while not swapped in
        self.sampler = HFSampler(self.policy)  # both models answer through the same code (a vLLM node's too)
        self.since_agreed: set[str] = set()  # untrusted peers that taught mixed since alone last equalled it
        self.offences: dict[str, int] = {}
        self.vouched: set[str] = set()  # untrusted peers that taught mixed through a measured gain, never blamed since
        self.recent: list[int] = []  # the last WINDOW checks' verdicts since the last one acted on: 1, -1 or 0
        self.resets = 0

    def step(self, batch: TrainBatch, taught_by: set[str]) -> None:
        """Train alone on the own rows of `batch`; `taught_by`: untrusted peers with a group of signal in it."""
        self.since_agreed |= taught_by
        own = batch.own.nonzero().flatten()  # [k]
        if len(own):
            self._swap()
            try:
                self.shadow.step(batch.rows(own))
            finally:
                self._swap()

    def check(self, round_index: int) -> Verdict:
        """Compare mixed with alone on the slice, act on a confirmed verdict (module docstring)."""
        start = time.perf_counter()
        mixed = self._solved()  # [n]
        self._swap()
        try:
            alone = self._solved()  # [n]
        finally:
            self._swap()
        b, c = int((alone & ~mixed).sum()), int((mixed & ~alone).sum())
        bar = max(self.margin * len(self.examples), Z * math.sqrt(b + c))
        self.recent = [*self.recent, int(b - c > bar) - int(c - b > bar)][-WINDOW:]  # 1: alone ahead, -1: mixed
        verdict = Verdict({})
        if self.recent.count(1) >= CONFIRM:
            self._copy(self.alone, self.params, self.shadow.optimizer, into=self.trainer.optimizer)
            self.trainer.policy_version += 1  # new weights: the sampler syncs, packets say so
            forgiven = self.since_agreed & self.vouched  # once: they lose the vouching instead
            for peer in sorted(self.since_agreed - forgiven):
                self.offences[peer] = self.offences.get(peer, 0) + 1
                verdict.distrusted[peer] = round_index + self._ban(self.offences[peer])
            self.vouched -= self.since_agreed
            self.resets += 1
            verdict.locked_until, verdict.admitted = round_index + self._ban(self.resets), frozenset(self.vouched | forgiven)
            log.warning("guard: peers' data made this node worse on its private slice (alone solves %d more of %d, "
                        "bar %.1f, in %d of the last %d checks): back to the weights trained on our own groups; not "
                        "training on %d peer(s) for a while (%s), nor on any but %d vouched for until round %d",
                        b - c, len(self.examples), bar, CONFIRM, WINDOW, len(verdict.distrusted),
                        sorted(verdict.distrusted), len(verdict.admitted), verdict.locked_until)
        elif self.recent.count(-1) >= CONFIRM:
            self._copy(self.params, self.alone, self.trainer.optimizer, into=self.shadow.optimizer)
            self.vouched |= self.since_agreed
        if max(self.recent.count(1), self.recent.count(-1)) >= CONFIRM:
            self.since_agreed, self.recent = set(), []
        n = max(len(self.examples), 1)
        verdict.stats.update({M.GUARD_MIXED: float(mixed.sum()) / n, M.GUARD_ALONE: float(alone.sum()) / n,
                              M.GUARD_GAP: (b - c) / n, M.GUARD_BAR: bar / n, M.GUARD_RESETS: self.resets,
                              M.TIME_GUARD: time.perf_counter() - start})
        return verdict

    def _ban(self, offences: int) -> int:
        """Rounds of a ban (or a lockdown) after `offences` offences: guard_ban_rounds, doubled each time."""
        return min(self.ban_rounds * 2 ** (offences - 1), MAX_BAN_ROUNDS)

    @torch.no_grad()
    def _copy(self, source: list[torch.Tensor], target: list[torch.Tensor], source_opt: torch.optim.Optimizer,
              into: torch.optim.Optimizer) -> None:
        """Weights `source` -> `target` (in place) and optimizer state `source_opt` -> `into` (a copy)."""
        for s, t in zip(source, target):
            t.data.copy_(s.data)
        into.load_state_dict(copy.deepcopy(source_opt.state_dict()))

    def _swap(self) -> None:
        """Exchange the trainable parameters' data with the reference's (twice: back as before)."""
        for i, p in enumerate(self.params):
            self.alone[i], p.data = p.data, self.alone[i]

    def _solved(self) -> torch.Tensor:
        """[n] bool: the greedy answer of the weights in place scores 1 on each slice example."""
        return torch.tensor(solved(self.sampler, self.policy, self.task, self.examples, self.max_new_tokens))

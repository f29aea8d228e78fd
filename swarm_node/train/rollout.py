"""Rollout: prompts -> groups of completions with generator log-probs and rewards -> buffer.

A *group* is the paper's unit: G completions sampled for one prompt, scored with the task's
binary reward. Groups are `codec.Group` objects, the same type that travels on the wire, so a
node's own groups and its peers' groups go through the same admission and training code.
Rewards are always computed by the node's `Scorer` (tasks/scoring.py) from the task's gold
answer: for the node's own samples right after generation and for every peer sample on receipt
(a sender's claimed reward is never trusted).

The `RolloutBuffer` sits between generation and training. Each entry carries its group and its
source (this node or a peer id); the loop fills it and drains it once per round.
"""

from __future__ import annotations

import hashlib
import math
import random
import secrets
from dataclasses import dataclass

import numpy as np

from swarm_node import metrics as M
from swarm_node.config import RolloutConfig
from swarm_node.tasks import Example, Task
from swarm_node.tasks.scoring import Scorer
from swarm_node.train.policy import Policy
from swarm_node.train.sampling import Sampler
from swarm_node.wire.codec import Completion, Group
from swarm_node.wire.schedule import scheduled_indices

OWN = "self"  # the source of the node's own groups in the buffer


def round_examples(task: Task, round_index: int, k: int, key: str) -> list[Example]:
    """The `k` training examples for a round: the first `k` of the schedule `key` (wire/schedule.py).

    In a swarm the key is public (vertical: the run and our peer id; horizontal: the run, so every
    node answers the same prompts), and receivers train only on groups of the sender's schedule.
    Alone it is ours (train.seed). Being a pure function of (key, round), it also makes `--resume`
    continue with exactly the prompts it would have used. The guard's reserve plays no part here: a
    node answers and offers reserved problems like any other and only leaves their groups out of its
    own step (train/reserve.py).
    """
    train = task.split("train")
    return [train[i] for i in scheduled_indices(key, round_index, len(train), k)]


def draws_key(seed: int | None, peer_id: str | None) -> str:
    """What a node's sampling seeds (and alone, its prompts) derive from: `train.seed` when set
    (reproducible, paired runs; give every node its own); unset, a swarm node's peer id, and 0 alone.
    In a swarm the prompts are the node's public schedule (wire/schedule.py), keyed by its peer id.

    Nodes left at one default seed would sample with the same seeds, and with the same warm start
    and prompts offer each other copies of their own groups (rejected as echoes). The peer id is
    stable across `--resume` given the same `--identity`.
    """
    if seed is not None:
        return str(seed)
    return f"peer/{peer_id}" if peer_id is not None else "0"


def round_seed(key: int | str, round_index: int) -> int:
    """The sampling seed of a round: a pure function of (key, round), so a resumed run repeats nothing."""
    return random.Random(f"sample/{key}/{round_index}").getrandbits(63)


def prompt_tokens(policy: Policy, task: Task, example: Example) -> list[int]:
    """The exact prompt a node conditions on (tasks/scoring.py renders it; chat template per
    config model.chat_template): generation, evaluation, the warm start and admission all use it."""
    return policy.scorer(task).prompt_tokens(example)


def sample_groups(sampler: Sampler, scorer: Scorer, examples: list[Example], cfg: RolloutConfig,
                  seed: int) -> list[Group]:
    """Sample `cfg.group_size` completions per example with `sampler`; rewards are left at 0
    (`scorer.score` sets them, and returns the texts it decoded)."""
    prompts = [scorer.prompt_tokens(ex) for ex in examples]
    samples = sampler.sample(prompts, cfg.group_size, cfg.max_new_tokens, cfg.temperature, seed)
    groups = []
    for ex, prompt, group_samples in zip(examples, prompts, samples):
        completions = [Completion(tokens=np.asarray(s.tokens, dtype=np.uint32),  # [T]
                                  logprobs=np.asarray(s.logprobs, dtype=np.float32),  # [T]
                                  finish_reason=s.finish_reason, reward=0.0) for s in group_samples]
        groups.append(Group(task=scorer.task.name, example_id=ex.id, prompt_tokens=np.asarray(prompt, dtype=np.uint32),
                            completions=completions))
    return groups


def generate_groups(sampler: Sampler, policy: Policy, task: Task, examples: list[Example], cfg: RolloutConfig,
                    seed: int) -> list[Group]:
    """Sampled and scored groups (for callers that do not need the decoded texts)."""
    scorer = policy.scorer(task)
    groups = sample_groups(sampler, scorer, examples, cfg, seed)
    scorer.score(groups)
    return groups


def has_signal(group: Group) -> bool:
    """Whether `group` can teach anything: its rewards differ (else every advantage is 0)."""
    return len({c.reward for c in group.completions}) > 1


@dataclass
class Rollout:
    """One group in the buffer, with where it came from."""

    group: Group
    source: str  # OWN, or the peer id that sent it


MAX_SERVED = 4096  # peers whose last turn in a step the buffer remembers (a forgotten one queues as a newcomer)
RETURN_PRIORITY = 4  # a peer back after missing rounds goes before those taken at most this many rounds ago


class RolloutBuffer:
    """Groups waiting to be trained on. `take` drains it into one step's batch, whose peer part is
    bounded by construction (docs/RELIABILITY.md, "bounded influence"):

        peer slots   = min(max_peer_groups, floor(peer_groups_per_own * own groups drawn))
        one peer    <= ceil(max_peer_share * peer slots) groups

    so peers' data never outweighs the node's own (at the default 1.0), and k peers share the
    slots: one liar's groups are at most ceil(share * slots) / (own + slots) of a step (1 in 4
    with the defaults: 2 own groups, 2 peer slots, 1 per peer). Own groups drawn, not kept: the
    guard's reserve drops ours on a reserved problem, and a round of 1 or 2 prompts whose own were
    all reserved (1 in 5, or 1 in 25) trained on nothing; the reserve is secret, so a peer cannot
    aim at those rounds, and the trainer judges their peers' positives by its latest own bar
    (Trainer._plausibility_floors). Peers are served round-robin, the one taken least recently first
    (a newcomer as if taken when it first delivered; ties in a secret order): with the starting peer
    chosen by round % peers, ids that chose their names and how many of them deliver each round kept
    the honest peer out of 200 of 200 steps (red team 10). Each peer's groups in arrival order, groups
    that can teach (`has_signal`) before those that cannot: peers sending valid groups whose rewards
    are all equal (no gradient) used to take 4 of 5 slots from the honest one. Unused groups are
    dropped (a later step must not train on older data than a peer's newer packet).

    Horizontal mode (every node answers the same prompts, groups merge across nodes) takes from
    each peer at most one group per prompt we answered, so a peer's weight in a merged group is
    its G completions beside ours, whatever it sends.
    """

    def __init__(self, max_peer_groups: int, peer_groups_per_own: float = 1.0, max_peer_share: float = 1.0,
                 horizontal: bool = False, salt: bytes | None = None):
        self.max_peer_groups, self.peer_groups_per_own = max_peer_groups, peer_groups_per_own
        self.max_peer_share, self.horizontal = max_peer_share, horizontal
        self.entries: list[Rollout] = []
        self.served: dict[str, int] = {}  # peer -> the round its groups were last taken (or it first delivered)
        self.seen: dict[str, int] = {}  # peer -> the latest round it delivered
        self.salt = secrets.token_bytes(16) if salt is None else salt  # orders ties: no peer can aim at them

    def add(self, groups: list[Group], source: str) -> None:
        self.entries.extend(Rollout(g, source) for g in groups)

    def take(self, round_index: int = 0, drawn: int | None = None) -> list[Rollout]:
        """This step's rollouts: ours, then the peers' within the bounds; `drawn`: how many own groups
        the round sampled (default: those added)."""
        own = [e for e in self.entries if e.source == OWN]
        drawn = len(own) if drawn is None else drawn
        by_peer: dict[str, list[Rollout]] = {}
        for e in self.entries:
            if e.source != OWN:
                by_peer.setdefault(e.source, []).append(e)
        peers = self._fair_order(list(by_peer), round_index)
        if self.horizontal:
            slots, queues = self.max_peer_groups, [self._one_per_prompt(by_peer[p], own) for p in peers]
        else:
            slots = min(self.max_peer_groups, math.floor(self.peer_groups_per_own * drawn + 1e-9))
            per_peer = math.ceil(self.max_peer_share * slots - 1e-9)
            queues = [sorted(by_peer[peer], key=lambda e: not has_signal(e.group))[:per_peer] for peer in peers]
        # vertical: every peer's teaching groups first, round-robin, then the rest (horizontal: a
        # group's signal only shows once merged with ours, so all count alike)
        teaches = (lambda e: True) if self.horizontal else (lambda e: has_signal(e.group))
        picked: list[Rollout] = []
        for teaching in (True, False):
            rest = [[e for e in queue if teaches(e) == teaching] for queue in queues]
            while len(picked) < slots and any(rest):
                for queue in rest:
                    if queue and len(picked) < slots:
                        picked.append(queue.pop(0))
        self.entries = []
        for e in picked:
            self.served.pop(e.source, None)
            self.served[e.source] = round_index  # newest last: the oldest entries are forgotten first
        for memory in (self.served, self.seen):
            while len(memory) > MAX_SERVED:
                del memory[next(iter(memory))]
        return own + picked

    def _fair_order(self, peers: list[str], round_index: int) -> list[str]:
        """The peers taken least recently first; a newcomer as if taken when it first delivered, and one back
        after a pause as if taken at most RETURN_PRIORITY rounds ago: ids that delivered once each and waited
        banked old turns, then came back together and kept a peer out for 99 rounds (red team 11)."""
        for peer in peers:
            back = self.seen.get(peer, round_index) < round_index - 1
            self.served[peer] = max(self.served.get(peer, round_index), round_index - RETURN_PRIORITY if back else -1)
            self.seen.pop(peer, None)
            self.seen[peer] = round_index
        return sorted(peers, key=lambda p: (self.served[p], hashlib.blake2b(
            f"{p}/{round_index}".encode(), key=self.salt, digest_size=8).digest()))

    @staticmethod
    def _one_per_prompt(entries: list[Rollout], own: list[Rollout]) -> list[Rollout]:
        """A peer's groups for prompts we answered, at most one per prompt (horizontal mode)."""
        wanted, out = {e.group.example_id for e in own}, []
        for e in entries:
            if e.group.example_id in wanted:
                wanted.discard(e.group.example_id)
                out.append(e)
        return out


def combine(rollouts: list[Rollout], mode: str) -> tuple[list[Group], list[str]]:
    """The training batch: groups as they are (vertical), or merged per example (horizontal), so
    the advantage is computed over the whole cross-node group; and each completion's source (OWN or
    the sending peer), in the batch's order."""
    if mode == "vertical":
        return [r.group for r in rollouts], [r.source for r in rollouts for _ in r.group.completions]
    merged: dict[str, tuple[Group, list[str]]] = {}
    for r in rollouts:
        group, sources = merged.setdefault(r.group.example_id, (
            Group(r.group.task, r.group.example_id, r.group.prompt_tokens, []), []))
        group.completions.extend(r.group.completions)
        sources.extend(r.source for _ in r.group.completions)
    return [g for g, _ in merged.values()], [s for _, sources in merged.values() for s in sources]


def group_stats(groups: list[Group], prefix: str = "") -> dict[str, float]:
    """Reward and length statistics of `groups` (TRL's names), keys optionally prefixed (`peer/`)."""
    rewards = np.array([c.reward for g in groups for c in g.completions], dtype=np.float64)  # [N]
    if rewards.size == 0:
        return {}
    lengths = np.array([len(c.tokens) for g in groups for c in g.completions], dtype=np.float64)  # [N]
    clipped = np.array([c.finish_reason == "length" for g in groups for c in g.completions])  # [N]
    zero_std = [not has_signal(g) for g in groups]
    return {prefix + M.REWARD_MEAN: float(rewards.mean()), prefix + M.REWARD_ZERO_STD_FRAC: float(np.mean(zero_std)),
            prefix + M.MEAN_LENGTH: float(lengths.mean()), prefix + M.CLIPPED_RATIO: float(clipped.mean())}

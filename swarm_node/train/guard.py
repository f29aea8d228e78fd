r"""Guard: peers' data may make this node better, never measurably worse than its own data alone.

Per-sample checks (admission, loss.teach_only, loss.implausible) bound what one packet can teach;
they cannot see *which* correct, plausible completions a peer chooses to send, and ids are free, so
k Sybils choosing them hold k/(k+1) of a step's peer slots (docs/RELIABILITY.md). The guard
measures what the peers' data did instead, against a reference no peer touches:

    mixed   the trained weights: own groups + peers' groups (what the node samples with and offers)
    alone   a copy trained only on groups it sampled itself, for the same rounds' prompts (same
            objective, its own optimizer): the node as it would be had it never joined

Every `swarm.guard_every` rounds (and after the last) both answer up to `swarm.guard_examples` train
problems greedily, the next ones of the node's reserve (train/reserve.py: a secret share of the
train problems that neither copy ever trains on, so the check measures skill, not recall; no peer
can know them, nor answer them specially; a check takes at most a third of the reserve, so a
window's are distinct). Per check b = solved by alone only, c = solved by mixed only (McNemar's
discordant pairs); over the last 3 checks since the last verdict B = sum b, C = sum c, N examples,
and the bar max(guard_margin * N, 2 sqrt(B + C)) (two standard deviations of B - C when the two are
equally good). A verdict needs at least 2 checks (the gap of two equally good models swings:
-0.14 to +0.13 within one honest run of 100 rounds), except after the last round:

    B - C > bar   harm: mixed <- alone (weights and optimizer state). The untrusted peers that
                  taught mixed (a group with signal) since the last verdict and had not taught
                  before it, or were banned in the last 200 rounds, are distrusted (no packet
                  admitted, unread, nobody waits for them; but at its first offence one linked
                  to us, present in half the rounds of this interval and the one before, is only
                  suspended: refused in the lockdown, keeping its link) for guard_ban_rounds, doubled per
                  offence (bans and forgivenesses, each forgotten 200 rounds after the latest;
                  an offender absent for most of them is new again, not known):
                  new ids are free, so a ban is cheap for them. And a lockdown: for
                  guard_ban_rounds, doubled per harm in the last 200 rounds (at most 8x; one in
                  force is never shortened), only vouched peers teach (64 Sybil ids would
                  otherwise take turns, each new batch un-teaching the node until the next
                  verdict); a vouched peer that taught
                  in the bad window is forgiven this once (not banned, admitted in the lockdown)
                  but loses its vouching and tenure; for 200 rounds after that it is spared at
                  a harm: refused in the lockdown, never banned, so its valid packets keep its
                  link (a ban let one id with tenure cut an honest neighbour off: red team 7);
                  one that delivered in none of the last VOUCH_SILENCE (50) rounds loses its vouching
    C - B > bar   help: the peers that taught in at least half the rounds since the last verdict
                  are vouched for. The reference stays alone: until session 24 it became a copy
                  of mixed here, and a gap that drifts by +-5 points made that a channel for harm
                  (`skew`: helps at rounds 10 and 55 vouched for the attackers and took their
                  influence so far, weights and optimizer moments, into the reference; held out
                  the victim then fell 14 points while its checks stayed level)
    otherwise     nothing

Tenure (every check that found no harm): a peer that taught in at least half the rounds since the
check before earns a check of tenure; TENURE (4) of them vouch for it, and teaching in a window found
harmful costs it all of them. Tenure and vouching last only while the peer stays present: at a check
with no harm found, a peer that delivered a valid packet in fewer than half the rounds since the one
before loses both (until session 29 tenure was never lost to silence and checks need not follow each
other, so ids taking turns could bank tenure, and one round in 50 kept a vouch: about 26 ids per 20
rounds could be vouched for, 130 after 100 rounds, each admitted in every lockdown). Presence counts
deliveries, not the step's choice: with 4 producers for a real model's 2 peer slots each is taken in
every other round, and an honest peer judged by what the step took never kept a vouch. Until session 26 only a measured gain vouched, and honest runs rarely
measure one: at a false alarm (8 of 21 no-attack runs of 100 rounds had at least one) the honest
neighbour was banned as new or refused in the lockdown, in one run for 81 rounds of 100. Tenure is a
privilege an attacker can earn too, by teaching steadily with no harm found for 20 rounds; what it
buys is one more window (the lockdown it is forgiven into) per 20 rounds of steady teaching with no
harm found, and the ids vouched for at any time, by tenure or by a gain, are ids that delivered in half
the rounds of the last interval: neighbours (D + 2 = 6 slots at min_peers = 1) and the few knockers a
starving node fetches from.

The bound, in plain words: at every check after the second since the last verdict, and after the
last round, the node is at most the bar behind a copy of itself that learned from its own groups
only, over the last 3 checks' problems (distinct, and never trained on: tiny arith's reserve holds
about 350, so N = 345 and the bar is 2 sqrt(B + C), 4-5 points; GSM8K's about 1,500, so N = 600);
any number of peers and Sybil ids can cost it at most that, plus what the rounds since the previous
check taught, and each harm buys them a longer lockdown. The bound is against the node alone, not
against what honest peers add: that gain is what an attacker can take away unseen. The margin is
wide because two equally good trajectories drift apart and back: with a 2-point margin, 2 of 3
honest runs of 100 rounds found harms (pooled gaps of 0.024 to 0.072). What it cannot stop: harm
below the bar; a bad window also locks honest peers out that were not vouched for, by a gain or by
tenure (the node then learns alone until the lockdown ends; they keep their links). Every checkpoint
keeps the guard's state (`state_dict`): a node restarted with --resume compares with the same
reference and keeps its bans, lockdown, vouching and tenure, so a crash does not launder a harm that
was not yet found into the reference.
Cost: a copy of the trainable weights and of the optimizer state (12 bytes per trainable
parameter, in the memory plan: models.estimate_memory), a second generation and training step each
round (`time/guard_s`), and 2 x guard_examples greedy answers per check, through the node's own sampler
(a vLLM node's engine is synced to the reference for its answers, then back: two syncs a check).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from swarm_node import metrics as M
from swarm_node.config import RolloutConfig
from swarm_node.tasks import Example, Task
from swarm_node.train.batch import TrainBatch
from swarm_node.train.evaluate import solved
from swarm_node.train.reserve import Reserve
from swarm_node.train.sampling import Sampler
from swarm_node.train.rollout import generate_groups
from swarm_node.train.trainer import Trainer

log = logging.getLogger(__name__)
Z = 2.0  # standard deviations of the paired difference a verdict needs
Z_ONE = 3.0  # ... the latest check alone needs (a harm pooling would dilute; 1 false alarm in ~740 checks)
WINDOW, CONFIRM = 3, 2  # checks pooled, checks a verdict needs (1 after the last round)
SMALL_WINDOW = 150  # problems per window below which the guard warns that it only sees large harms
MAX_BAN_ROUNDS = 10_000  # a ban of an id doubles per offence up to this
LOCKDOWN_MEMORY, MAX_LOCKDOWN_DOUBLINGS = 200, 3  # harms of the last 200 rounds double a lockdown, at most 8x
VOUCH_SILENCE = 50  # a vouched peer that delivered in none of our last 50 rounds is no longer admitted in a lockdown
MAX_KNOWN = 4096  # peers remembered as having taught before a verdict (a forgotten one is new again at a harm),
#                  and new peers remembered as teaching since it
TENURE = 4  # checks with no harm found, each after teaching in at least half the rounds since the one before, vouch


STATE_KEYS = {"alone", "optimizer", "taught", "rounds", "known", "offences", "vouched", "recent", "harms", "resets",
              "bans", "locked_until", "lockdown_admits", "reserve_key", "reserve_share", "reserve_cursor", "reserve_order"}


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

    def __init__(self, trainer: Trainer, shadow: Trainer, sampler: Sampler, task: Task, examples: int,
                 rollout: RolloutConfig, margin: float, ban_rounds: int, reserve_share: float):
        """`trainer`: the mixed weights' (its policy holds them); `shadow`: a second Trainer of the same
        policy; `sampler`: the node's, synced to each model in turn; `examples`: answered by each model per
        check; `reserve_share`: of the train problems, kept for the checks (`self.reserve`)."""
        self.policy, self.trainer, self.shadow, self.sampler, self.task = trainer.policy, trainer, shadow, sampler, task
        self.examples, self.rollout, self.margin, self.ban_rounds = examples, rollout, margin, ban_rounds
        self.params = self.policy.trainable_parameters()
        self.alone = [p.detach().clone() for p in self.params]  # the reference's weights while not swapped in
        self.alone_version = 0  # the sampler's version for the reference's weights: a new negative one each time
        self.reserve = self._reserve(reserve_share)  # the checks' problems: secret, never trained on
        self.taught: Counter[str] = Counter()  # untrusted peer -> rounds it taught mixed since the last verdict
        self.rounds = 0  # rounds since the last verdict
        self.known: dict[str, None] = {}  # peers that taught before the last verdict, the latest MAX_KNOWN, oldest first
        self.offences: Counter[str] = Counter()  # bans of each peer, forgotten LOCKDOWN_MEMORY rounds after its latest
        self.offended_at: dict[str, int] = {}  # peer -> round of its latest offence
        self.presence: Counter[str] = Counter()  # offender -> rounds it delivered a valid packet since that offence
        self.forgiven_at: dict[str, int] = {}  # peer -> round of the harm it was forgiven at (the last LOCKDOWN_MEMORY)
        self.suspended_at: dict[str, int] = {}  # peer -> round of the harm it was suspended at (the last LOCKDOWN_MEMORY)
        self.steady: set[str] = set()  # peers present in half the rounds of the last interval
        self.steps = 0  # rounds stepped
        # peers that taught through a measured gain, or for TENURE checks with no harm found, and were in no harmful
        # window since -> the latest step they taught in (silent for VOUCH_SILENCE steps: no longer vouched for)
        self.vouched: dict[str, int] = {}
        # peer -> checks with no harm found that it taught through (in at least half the rounds since the check
        # before), since it last taught in a window found harmful: TENURE of them vouch for it
        self.tenure: Counter[str] = Counter()
        self.interval: Counter[str] = Counter()  # untrusted peer -> rounds it taught mixed since the last check
        self.present: Counter[str] = Counter()  # untrusted peer -> rounds it delivered a valid packet since the last check
        self.interval_rounds = 0  # rounds since the last check
        self.recent: list[tuple[int, int, int]] = []  # (b, c, n) of the last WINDOW checks since the last verdict
        self.harms: list[int] = []  # rounds of the harms found
        self.resets = 0
        self.bans: dict[str, int] = {}  # peer -> round its latest ban ends (what admission was told)
        self.locked_until, self.lockdown_admits = 0, frozenset[str]()  # the latest lockdown

    def step(self, examples: list[Example], seed: int, taught_by: set[str], present: set[str] = frozenset()) -> float:
        """Alone samples its own groups for this round's prompts and trains on them: never on what the
        trained model wrote (poison that narrows what it writes would otherwise slow both copies alike).
        `taught_by`: untrusted peers with a row of a group with signal in the round's step; `present`: those
        that delivered a valid packet this round, taken or not (a teacher is present). Returns the seconds taken."""
        start = time.perf_counter()
        self.taught.update(taught_by)
        if len(self.taught) > MAX_KNOWN:  # free ids teaching once each between verdicts: the oldest new ones go
            fresh = [p for p in self.taught if p not in self.vouched and p not in self.known]  # never the blamable
            for peer in fresh[:len(self.taught) - MAX_KNOWN]:
                del self.taught[peer]
        self.interval.update(taught_by)
        self.present.update(set(present) | set(taught_by))
        self.presence.update(p for p in set(present) | set(taught_by) if p in self.offended_at)
        self.rounds += 1
        self.interval_rounds += 1
        self.steps += 1
        self._forget(self._silent())  # before the refresh: a peer back from silence earns its vouch again
        # present, not only taught: which peers a step takes, peers can steer (red team 10: a vouch lapsed while its
        # peer delivered every round, and never taken); one silent for VOUCH_SILENCE steps still loses it
        self.vouched.update(dict.fromkeys((set(taught_by) | set(present)) & self.vouched.keys(), self.steps))
        examples = [ex for ex in examples if not self.reserve.reserved(ex)]  # horizontal mode: the run's prompts
        if not examples:
            return time.perf_counter() - start
        try:
            with self._alone_in_place():
                self._sync_alone()
                groups = generate_groups(self.sampler, self.policy, self.task, examples, self.rollout, seed)
                self.shadow.step(TrainBatch.from_groups(groups, self.policy.pad_id,
                                                        own=[True] * sum(len(g.completions) for g in groups)))
        finally:
            self.sampler.sync(self.policy, self.trainer.policy_version)
        return time.perf_counter() - start

    def _sync_alone(self) -> None:
        """The sampler to the reference's weights (in place now, or just copied into the trained ones): a
        version no weights had before."""
        self.alone_version -= 1
        self.sampler.sync(self.policy, self.alone_version)

    def check(self, round_index: int, last: bool = False) -> Verdict:
        """Compare mixed with alone on a fresh slice, act on a verdict (module docstring); `last`:
        after the run's last round, when one check is enough."""
        start = time.perf_counter()
        per_check = min(self.examples, len(self.reserve.pool) // WINDOW)
        examples = self.reserve.next_slice(WINDOW * per_check if last else per_check)  # the last: a whole window
        self.sampler.sync(self.policy, self.trainer.policy_version)
        mixed = self._solved(examples)  # [n]
        try:
            with self._alone_in_place():
                self._sync_alone()
                alone = self._solved(examples)  # [n]
        finally:
            self.sampler.sync(self.policy, self.trainer.policy_version)
        latest = (int((alone & ~mixed).sum()), int((mixed & ~alone).sum()), len(examples))
        self.recent = [latest] if last else [*self.recent, latest][-WINDOW:]  # the last check is the whole window
        B, C, N = (sum(x) for x in zip(*self.recent))
        bar = max(self.margin * N, Z * math.sqrt(B + C))
        b, c, n = latest
        fresh_harm = not last and b - c > max(self.margin * n, Z_ONE * math.sqrt(b + c))  # poison since the last check
        ready = len(self.recent) >= (1 if last else CONFIRM)
        verdict = Verdict({})
        steady = {p for p, k in self.present.items() if 2 * k >= max(1, self.interval_rounds)}  # present this interval
        if ready and B - C > bar or fresh_harm:
            self._harm(round_index, verdict, linked=steady & self.steady)
            log.warning("guard: peers' data made this node worse (over %d reserved problems alone solves %d more, bar "
                        "%.1f; the latest check %d more of %d): back to the weights trained on our own groups; %d peer(s) "
                        "distrusted %s; only %d vouched for teach until round %d", N, B - C, bar, b - c, n,
                        len(verdict.distrusted), sorted(verdict.distrusted), len(verdict.admitted), verdict.locked_until)
        else:
            self._credit_tenure()
            if ready and C - B > bar:
                # each taught within the last `rounds`
                self.vouched.update(dict.fromkeys((p for p, n in self.taught.items() if 2 * n >= self.rounds), self.steps))
        self.steady = steady if self.interval_rounds else self.steady  # a second check in a round judges nothing
        self.interval, self.present, self.interval_rounds = Counter(), Counter(), 0
        if ready and abs(B - C) > bar or fresh_harm:
            for peer in self.taught:  # newest last
                self.known.pop(peer, None)
                self.known[peer] = None
            for peer in list(self.known)[:max(0, len(self.known) - MAX_KNOWN)]:  # free ids must not grow every checkpoint
                del self.known[peer]
            self.taught, self.rounds, self.recent = Counter(), 0, []
        verdict.stats.update({M.GUARD_MIXED: float(mixed.float().mean()), M.GUARD_ALONE: float(alone.float().mean()),
                              M.GUARD_GAP: (B - C) / N, M.GUARD_BAR: bar / N, M.GUARD_RESETS: self.resets,
                              M.GUARD_VOUCHED: len(self.vouched), M.TIME_GUARD: time.perf_counter() - start})
        return verdict

    def _credit_tenure(self) -> None:
        """No harm found: a check of tenure for each peer that taught in at least half the rounds since the
        last check; TENURE of them vouch for it. A steady honest neighbour is then admitted through a
        false alarm's lockdown (this once); Sybils must each teach that steadily, and the step's peer slots
        bound how many can (docs/RELIABILITY.md). A peer that delivered in fewer than half the rounds loses
        its tenure and vouch: neither is banked while absent, and only neighbours (and knockers) deliver."""
        if not self.interval_rounds:  # a second check in one round (the last round's): nothing to judge
            return
        steady = {p for p, n in self.interval.items() if 2 * n >= self.interval_rounds}
        present = {p for p, n in self.present.items() if 2 * n >= self.interval_rounds}
        self._forget((self.tenure.keys() | self.vouched.keys()) - present)  # none is banked or kept while absent
        self.tenure.update(steady)
        self.vouched.update(dict.fromkeys((p for p in steady if self.tenure[p] >= TENURE), self.steps))

    def _harm(self, round_index: int, verdict: Verdict, linked: set[str] = frozenset()) -> None:
        """Back to alone; distrust the new teachers; a lockdown for all but the vouched. `linked`: the peers
        present in half the rounds of this interval and of the one before (neighbours, in practice)."""
        self._reset_to_alone()
        # new weights: the sampler syncs to a version no weights had before. Not the published policy version
        # (optimizer steps, SPEC section 1): a jump in it told every peer that a harm was found (red team 7)
        self._sync_alone()
        taught = set(self.taught)  # new ids, and ids banned before that taught again: each ban doubles
        # offences older than LOCKDOWN_MEMORY are forgotten, as harms are: else an honest peer banned once (it was new
        # in a bad window) was banned again at every later false alarm, up to 10,000 rounds (red team, session 24)
        aged = {p: r for p, r in self.offended_at.items() if round_index - r >= LOCKDOWN_MEMORY}
        for peer, r in aged.items():  # an offender absent for most rounds since is new again (known, with its offence
            # forgotten, ids banned once came back 200 rounds later unbannable, only ever refused: red team 10)
            if peer not in self.vouched and 2 * self.presence[peer] < round_index - r:
                self.known.pop(peer, None)
            del self.offended_at[peer], self.presence[peer]
        self.offences = Counter({p: n for p, n in self.offences.items() if p in self.offended_at})
        forgiven = taught & self.vouched.keys()  # this once: not banned, admitted in the lockdown; the offence counts
        # forgiven at a harm of the last LOCKDOWN_MEMORY rounds, not vouched again since: refused in the lockdown but
        # never banned (a ban is refused unread, so the peer lost its link: one id with tenure got an honest neighbour
        # forgiven beside it, poisoned on in the lockdown, and the next harm cut the neighbour off; red team 7)
        spared = {p for p in taught - forgiven if round_index - self.forgiven_at.get(p, -LOCKDOWN_MEMORY) < LOCKDOWN_MEMORY}
        # banned: new ids, and ids banned in the last LOCKDOWN_MEMORY rounds; a known id is refused in the lockdown only
        # (charging it too banned an honest neighbour that two false alarms found unvouched: red team 8)
        self.suspended_at = {p: r for p, r in self.suspended_at.items() if round_index - r < LOCKDOWN_MEMORY}
        blamed = {p for p in taught - forgiven - spared if p not in self.known or self.offences[p] or p in self.suspended_at}
        # a linked id's first offence: suspended (refused in the lockdown, keeps its link), banned at its next: a ban
        # cut an honest neighbour that was new here off, and the two honest nodes apart for 37 rounds (red team 10)
        suspended = {p for p in blamed & linked if not self.offences[p] and p not in self.suspended_at}
        banned = blamed - suspended
        for peer in suspended:  # no offence, but an offender's clock: absent for most of the next 200 rounds, it is new
            # again, not known (a linked Sybil suspended once came back unbannable: red team 11)
            self.suspended_at[peer], self.offended_at[peer], self.presence[peer] = round_index, round_index, 0
        for peer in sorted(forgiven | banned):
            self.offences[peer] += 1
            self.offended_at[peer], self.presence[peer] = round_index, 0
        for peer in sorted(banned):
            verdict.distrusted[peer] = round_index + min(self.ban_rounds * 2 ** (self.offences[peer] - 1), MAX_BAN_ROUNDS)
        self.forgiven_at = {p: r for p, r in self.forgiven_at.items() if round_index - r < LOCKDOWN_MEMORY}
        self.forgiven_at.update(dict.fromkeys(forgiven, round_index))
        self._forget(taught)  # their vouch and tenure are earned again from 0 (the silent ones went at their step)
        self.resets += 1
        self.harms = [r for r in self.harms if round_index - r < LOCKDOWN_MEMORY] + [round_index]
        doublings = min(len(self.harms) - 1, MAX_LOCKDOWN_DOUBLINGS)
        # a lockdown in force is never shortened (harms forgotten can make the new one end sooner); who is admitted is
        # decided anew (red team 7: admission kept the old set, the guard's state said the new one)
        verdict.locked_until = max(round_index + self.ban_rounds * 2 ** doublings, self.locked_until)
        verdict.admitted = frozenset(self.vouched.keys() | forgiven)
        self.bans = {p: end for p, end in self.bans.items() if end > round_index} | verdict.distrusted
        self.locked_until, self.lockdown_admits = verdict.locked_until, verdict.admitted

    def _silent(self) -> set[str]:
        """Vouched peers that delivered in none of the last VOUCH_SILENCE steps: else ids vouched for early that
        fell silent were the only ones every later lockdown admitted (red team, session 24), free to come back
        and teach a window each; their tenure goes too, or one steady interval back would vouch again (and
        before session 27 one round back kept the vouch)."""
        return {p for p, step in self.vouched.items() if self.steps - step >= VOUCH_SILENCE}

    def _forget(self, peers: set[str]) -> None:
        """`peers` lose their vouch and their tenure."""
        self.vouched = {p: step for p, step in self.vouched.items() if p not in peers}
        self.tenure = Counter({p: n for p, n in self.tenure.items() if p not in peers})

    def state_dict(self) -> dict:
        """All of the guard's state, for a checkpoint (tensors and plain values: torch.load(weights_only=True) reads it)."""
        return {"alone": [a.detach().clone() for a in self.alone], "optimizer": self.shadow.optimizer.state_dict(),
                "taught": dict(self.taught), "rounds": self.rounds, "known": list(self.known),
                "offences": dict(self.offences), "offended_at": dict(self.offended_at), "vouched": dict(self.vouched),
                "forgiven_at": dict(self.forgiven_at), "presence": dict(self.presence),
                "suspended_at": dict(self.suspended_at), "steady": sorted(self.steady),
                "steps": self.steps, "tenure": dict(self.tenure), "interval": dict(self.interval),
                "present": dict(self.present),
                "interval_rounds": self.interval_rounds,
                "recent": [list(x) for x in self.recent],
                "harms": list(self.harms), "resets": self.resets, "bans": dict(self.bans),
                "locked_until": self.locked_until, "lockdown_admits": sorted(self.lockdown_admits),
                "reserve_key": self.reserve.key.hex(), "reserve_share": self.reserve.share,
                "reserve_cursor": self.reserve.cursor, "reserve_order": list(self.reserve.order)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state_dict()`'s output; ValueError (and nothing changed) if it is not one that fits."""
        shapes = [tuple(p.shape) for p in self.params]
        missing = STATE_KEYS - state.keys()
        if missing or [tuple(a.shape) for a in state["alone"]] != shapes:
            raise ValueError(f"the saved guard state lacks {sorted(missing)}" if missing else
                             f"the guard's saved reference has other shapes than the trainable weights ({len(shapes)} tensors)")
        if state["reserve_share"] != self.reserve.share:  # problems trained on must not join the reserve
            log.warning("swarm.guard_reserve %s differs from the run's %s: the run's is kept", self.reserve.share,
                        state["reserve_share"])
        for a, saved in zip(self.alone, state["alone"]):
            a.copy_(saved)
        self.shadow.optimizer.load_state_dict(state["optimizer"])
        self.taught, self.rounds = Counter(state["taught"]), state["rounds"]
        self.known, self.offences = dict.fromkeys(state["known"]), Counter(state["offences"])
        self.offended_at = dict(state.get("offended_at", {}))  # absent before session 24: those offences are forgotten
        self.forgiven_at = dict(state.get("forgiven_at", {}))  # absent before session 30
        # absent before session 31: offenders count as present (an honest peer banned once must not become bannable)
        self.presence = Counter(state.get("presence", dict.fromkeys(self.offended_at, LOCKDOWN_MEMORY)))
        self.suspended_at, self.steady = dict(state.get("suspended_at", {})), set(state.get("steady", []))  # ditto
        self.steps, vouched = state.get("steps", 0), state["vouched"]
        if not isinstance(vouched, dict):  # before session 26: a list, and the steps apart (before session 25: none)
            vouched = {p: state.get("taught_step", {}).get(p, 0) for p in vouched}
        self.vouched = dict(vouched)
        # absent before session 27: tenure is earned from 0
        self.tenure, self.interval = Counter(state.get("tenure", {})), Counter(state.get("interval", {}))
        self.present = Counter(state.get("present", state.get("interval", {})))  # absent before session 29
        self.interval_rounds = state.get("interval_rounds", 0)
        self.recent, self.harms, self.resets = [tuple(x) for x in state["recent"]], list(state["harms"]), state["resets"]
        self.bans, self.locked_until = dict(state["bans"]), state["locked_until"]
        self.lockdown_admits = frozenset(state["lockdown_admits"])
        self.reserve = self._reserve(state["reserve_share"], bytes.fromhex(state["reserve_key"]))  # the same problems
        self.reserve.order, self.reserve.cursor = list(state["reserve_order"]), state["reserve_cursor"]

    def _reserve(self, share: float, key: bytes | None = None) -> Reserve:
        """The reserve, with enough problems for a window (`limit`: more are not needed; a huge split is not scanned)."""
        reserve = Reserve(self.task, share, key, limit=WINDOW * self.examples)
        if len(reserve.pool) < WINDOW:
            raise ValueError(f"swarm.guard_reserve = {share} keeps {len(reserve.pool)} of {self.task.name}'s "
                             f"train problems; the guard needs at least {WINDOW}: raise it")
        window = WINDOW * min(self.examples, len(reserve.pool) // WINDOW)
        if window < SMALL_WINDOW:
            log.warning("the guard's reserve holds %d problems (%s of %s's): it sees a harm only above about %.0f "
                        "points; raise swarm.guard_reserve or use a task with more problems", len(reserve.pool), share,
                        self.task.name, 100 * max(self.margin, Z / math.sqrt(window)))
        return reserve

    @torch.no_grad()
    def _reset_to_alone(self) -> None:
        """The trained weights and optimizer state <- the reference's (copies)."""
        for a, p in zip(self.alone, self.params):
            p.data.copy_(a.data)
        self.trainer.optimizer.load_state_dict(copy.deepcopy(self.shadow.optimizer.state_dict()))

    @contextmanager
    def _alone_in_place(self) -> Iterator[None]:
        """The reference's weights in the trainable parameters for the block, then the trained ones
        again (the tensors are exchanged, not copied; what the block does to them stays the reference's)."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    def _swap(self) -> None:
        for i, p in enumerate(self.params):
            self.alone[i], p.data = p.data, self.alone[i]

    def _solved(self, examples: list[Example]) -> torch.Tensor:
        """[n] bool: the greedy answer of the weights in place scores 1 on each example."""
        return torch.tensor(solved(self.sampler, self.policy, self.task, examples, self.rollout.max_new_tokens))

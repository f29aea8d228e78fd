"""Reliability and security: hostile peers, crashes and bad input never corrupt a node.

docs/RELIABILITY.md is the table of every case, what was tried and what happened; each row names
a test here or in tests/test_fuzz.py. Fast tests (unit level, in process) come first; the slow
ones start real `swarm-node join` processes and a hostile peer process (swarm_node/harness/adversary.py) on
127.0.0.1, SIGSTOP/SIGKILL them, and fill disks.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from typer.testing import CliRunner

from swarm_node.commands.cli import app
from swarm_node.config import RolloutConfig, load_config
from swarm_node.harness.process import NodeProcess
from swarm_node.harness.warmstart import public_warm_start
from swarm_node.metrics import MetricsError, MetricsWriter, drop_rounds_after, read_metrics
from swarm_node.net import Collected, PeerInfo, Received
from swarm_node.net.collect import CollectLimits, Delivery, collect_offers
from swarm_node.net.fetch import MISMATCH, OVERSIZE, TIMEOUT
from swarm_node.swarm import Rejected
from swarm_node.swarm.admit import Admission, Expectations
from swarm_node.swarm.exchange import Exchange
from swarm_node.train.rollout import generate_groups, round_examples
from swarm_node.train.sampling.hf import HFSampler
from swarm_node.wire.codec import Completion, Group, Packet, _normalize, _pieces
from swarm_node.wire.codec import digest as packet_digest
from swarm_node.wire.codec import encode, tokenizer_fingerprint

ME, HONEST, EVIL = "QmMe", "QmHonest", "QmEvil"


# ================================================================================ per-peer limits (unit)

def _digest(tag) -> str:
    return packet_digest(str(tag).encode())


async def _collect(peers, fetch_fn, *, seen=None, taken=None, counted=None, dropped=None, wanted=lambda r: True,
                   newest=None, min_packets=0, deadline_s=2.0, **limits):
    """collect_offers counting packets, with the limits as keywords; `seen`, `taken`, `counted` and
    `dropped` carry over between calls when the caller passes them."""
    state = Delivery(delivered=dict.fromkeys(seen or (), 0), taken={} if taken is None else taken,
                     counted=set() if counted is None else counted)
    limits = CollectLimits(**{"fetch_timeout_s": 1.0, "max_packet_bytes": 16 * 2**20, "max_peer_packets": 4,
                              "max_peer_bytes": 32 * 2**20, "poll_s": 0.05, **limits})

    async def list_peers(timeout):
        return peers

    async def fetch(peer, digest, timeout, declared_size):
        return await fetch_fn(peer, digest, timeout)

    got = await collect_offers(list_peers, fetch, limits, state, wanted=wanted, newest=newest, min_count=min_packets,
                               deadline_s=deadline_s, count_peers=False)
    if seen is not None:
        seen.update(state.delivered)
    if dropped is not None:
        dropped.update(got.dropped)
    return got.packets


def _peer(pid, offers) -> PeerInfo:
    return PeerInfo(pid, "m", "t", 1, 1, 1, list(offers), 0.0)


def test_flood_one_packet_per_peer_and_round_ever():
    """16 offers for one round from one peer: one is fetched, now and in every later round."""
    flood = [(5, _digest(f"flood{i}"), 1000) for i in range(16)]
    calls: list[tuple[str, str]] = []

    async def fetch(peer, d, timeout):
        calls.append((peer, d))
        return b"x" * 1000, "ok"

    async def main():
        taken, counted, seen = {}, set(), set()
        dropped = Counter()
        got = await _collect([_peer(EVIL, flood)], fetch, taken=taken, counted=counted, dropped=dropped, seen=seen)
        assert [g.digest for g in got] == [flood[0][1]] and taken == {(EVIL, 5): flood[0][1]}
        # a second pass and a later round: still nothing more for round 5, and each drop counted once
        for _ in range(3):
            got = await _collect([_peer(EVIL, flood)], fetch, taken=taken, counted=counted, dropped=dropped, seen=seen)
            assert got == []
        assert calls == [(EVIL, flood[0][1])]
        assert dropped == Counter({"duplicate_round": 15})

    asyncio.run(main())


def test_per_peer_packet_and_byte_budgets_per_round():
    many_rounds = [(r, _digest(f"r{r}"), 1000) for r in range(10)]
    big = [(r, _digest(f"big{r}"), 10 * 2**20) for r in range(10)]

    async def fetch(peer, d, timeout):
        return b"x", "ok"

    async def main():
        dropped = Counter()
        got = await _collect([_peer(EVIL, many_rounds), _peer(HONEST, [(1, _digest("h"), 10)])], fetch,
                             dropped=dropped, max_peer_packets=4)
        by_peer = Counter(g.peer_id for g in got)
        assert by_peer == {EVIL: 4, HONEST: 1} and dropped == Counter({"flood": 6})
        dropped = Counter()
        got = await _collect([_peer(EVIL, big)], fetch, dropped=dropped, max_peer_bytes=32 * 2**20)
        assert len(got) == 3 and dropped == Counter({"too_many_bytes": 7})
        dropped = Counter()
        got = await _collect([_peer(EVIL, [(1, _digest("huge"), 2**31)])], fetch, dropped=dropped)
        assert got == [] and dropped == Counter({"oversize": 1})

    asyncio.run(main())


def test_misbehaviour_counts_and_refusals_do_not_use_the_budget():
    offers = [(r, _digest(f"o{r}"), 100) for r in range(6)]
    outcome = {offers[0][1]: MISMATCH, offers[1][1]: OVERSIZE, offers[2][1]: "not_found", offers[3][1]: TIMEOUT}

    async def fetch(peer, d, timeout):
        reason = outcome.get(d)
        return (None, reason) if reason else (b"y" * 100, "ok")

    async def main():
        dropped = Counter()
        got = await _collect([_peer(EVIL, offers)], fetch, dropped=dropped, max_peer_packets=4, min_packets=2,
                             deadline_s=1.0, fetch_timeout_s=0.05)
        # mismatch + oversize use 2 of the 4 slots; not_found / timeout give theirs back: both good ones arrive
        assert sorted(g.round for g in got) == [4, 5]
        assert dropped == Counter({"digest_mismatch": 1, "oversize": 1})

    asyncio.run(main())


def test_replayed_digest_is_fetched_once_whoever_offers_it():
    d = _digest("packet")
    calls = []

    async def fetch(peer, digest, timeout):
        calls.append(peer)
        return b"p", "ok"

    async def main():
        seen = set()
        for _ in range(5):  # five rounds of the same offer (replays), from two peers
            await _collect([_peer(EVIL, [(3, d, 1)]), _peer(HONEST, [(3, d, 1)])], fetch, seen=seen)
        assert len(calls) == 1 and seen == {d}

    asyncio.run(main())


def test_a_stalling_peer_holds_one_fetch_slot_and_costs_at_most_the_fetch_timeout():
    stall = [(r, _digest(f"s{r}"), 100) for r in range(8)]
    good = (1, _digest("good"), 100)
    started = Counter()

    async def fetch(peer, d, timeout):
        started[peer] += 1
        if peer == EVIL:
            await asyncio.sleep(timeout)  # accepts, never answers: the fetch timeout ends it
            return None, TIMEOUT
        return b"g", "ok"

    async def main():
        t0 = time.monotonic()
        got = await _collect([_peer(EVIL, stall), _peer(HONEST, [good])], fetch, min_packets=1, deadline_s=5.0,
                             fetch_timeout_s=1.0, max_parallel=2)
        assert [g.peer_id for g in got] == [HONEST]
        assert time.monotonic() - t0 < 0.5 and started[EVIL] <= 1  # never more than one stalled fetch at a time
        t0 = time.monotonic()
        got = await _collect([_peer(EVIL, stall)], fetch, min_packets=1, deadline_s=2.5, fetch_timeout_s=1.0)
        elapsed = time.monotonic() - t0
        assert got == [] and 2.4 < elapsed < 2.9 and started[EVIL] <= 1 + 3  # one at a time, each <= 1 s

    asyncio.run(main())


def test_a_node_behind_its_peers_does_not_wait_for_what_cannot_come():
    """Peers already past our newest wanted round, with nothing wanted left: return at once, not at the deadline."""
    async def fetch(peer, d, timeout):
        return b"x", "ok"

    async def main():
        ahead = _peer(HONEST, [(r, _digest(r), 1) for r in (17, 18, 19, 20)])
        ahead.round = 20
        wanted = dict(wanted=lambda r: 8 <= r <= 12, newest=12, min_packets=1, deadline_s=3.0)
        t0 = time.monotonic()
        assert await _collect([ahead], fetch, **wanted) == []
        assert time.monotonic() - t0 < 0.5
        behind = _peer(EVIL, [(5, _digest(5), 1)])
        behind.round = 5  # may still reach our rounds: wait for it, up to the deadline
        t0 = time.monotonic()
        assert await _collect([ahead, behind], fetch, **{**wanted, "deadline_s": 0.5}) == []
        assert time.monotonic() - t0 >= 0.5
        t0 = time.monotonic()
        assert await _collect([], fetch, **{**wanted, "deadline_s": 0.5}) == []  # alone: peers may still appear
        assert time.monotonic() - t0 >= 0.5

    asyncio.run(main())


# ================================================================================ accept checks (unit)

@pytest.fixture
def crafted(tiny_policy, arith):
    groups = generate_groups(HFSampler(tiny_policy), tiny_policy, arith, round_examples(arith, 5, 2, "peer"),
                             RolloutConfig(group_size=3, max_new_tokens=6), seed=0)
    expect = Expectations(run_id="run", tokenizer=tokenizer_fingerprint(tiny_policy.tokenizer), staleness=2,
                          max_tokens=6)

    def packet(gs=None, raw=False, **changes) -> bytes:
        fields = dict(run_id="run", sender=EVIL, model_id="tiny-s", tokenizer=expect.tokenizer, policy_version=3,
                      round=5, mode="vertical", groups=groups if gs is None else gs)
        fields.update(changes)
        p = Packet(**fields)
        return b"".join(_pieces(_normalize(p))) if raw else encode(p)  # raw: canonical, unvalidated

    return tiny_policy, arith, groups, expect, packet


def accept_packet(data, remote, expect, task, policy, offered_round=5, admission=None):
    """Admission of `data` fetched from `remote`, announced for `offered_round`, at our round 5."""
    admission = admission or Admission(expect, policy.scorer(task))
    return admission.check(Received(remote, offered_round, packet_digest(data), data), 5)


def _reason(fn) -> str | None:
    try:
        fn()
    except Rejected as e:
        return e.reason
    return None


def test_every_hostile_packet_kind_is_rejected_with_its_reason(crafted):
    policy, task, groups, expect, packet = crafted
    g0 = groups[0]

    def with_group(**kw):
        return [Group(**{**g0.__dict__, **kw})] + groups[1:]

    test_example = task.split("test")[0]
    from swarm_node.train.rollout import prompt_tokens

    held_out = with_group(example_id=test_example.id,
                          prompt_tokens=np.asarray(prompt_tokens(policy, task, test_example), np.uint32))
    long = with_group(completions=[Completion(np.full(7, 5, np.uint32), np.full(7, -1.0, np.float32), "length", 0.0)])

    def comps(**kw):
        return with_group(completions=[Completion(**{**g0.completions[0].__dict__, **kw})])

    n = len(g0.completions[0].tokens)
    cases = {
        "codec_bad_logprob": packet(comps(logprobs=np.full(n, 0.5, np.float32)), raw=True),
        "codec_token_out_of_range": packet(comps(tokens=np.full(n, policy.vocab_size, np.uint32)), raw=True),
        "codec_bad_msgpack": packet()[:-3],
        "codec_length_mismatch": packet(comps(logprobs=np.zeros(n + 1, np.float32)), raw=True),
        "unknown_example": packet(with_group(example_id="train/99999999")),
        "prompt_mismatch": packet(with_group(prompt_tokens=groups[1].prompt_tokens)),
        "held_out_example": packet(held_out),
        "too_long": packet(long),
        "sender_mismatch": packet(sender=HONEST),
        "wrong_run": packet(run_id="other"),
        "stale": packet(round=1),
    }
    for reason, data in cases.items():
        offered = 1 if reason == "stale" else 5
        assert _reason(lambda: accept_packet(data, EVIL, expect, task, policy, offered)) == reason, reason
    assert _reason(lambda: accept_packet(packet(round=4), EVIL, expect, task, policy, offered_round=5)) == "round_mismatch"


def test_lies_about_rewards_and_logprobs_are_bounded_not_trusted(crafted):
    """(a) log-prob lies pass the codec only within [-inf, 0]; (b) claimed rewards are recomputed and counted."""
    policy, task, groups, expect, packet = crafted
    for g in groups:
        for c in g.completions:
            c.reward, c.logprobs = 1.0, np.zeros(len(c.tokens), np.float32)  # "pi_gen = 1, all correct"
    admission = Admission(expect, policy.scorer(task))
    accepted = accept_packet(packet(), EVIL, expect, task, policy, admission=admission)
    truth = [task.reward(policy.decode(c.tokens), task.example(g.example_id)) for g in accepted.groups for c in g.completions]
    assert [c.reward for g in accepted.groups for c in g.completions] == truth
    assert admission.take_stats()["swarm/rewards_corrected"] == sum(t != 1.0 for t in truth)
    assert sum(t != 1.0 for t in truth) > 0 and admission.take_stats()["swarm/rewards_corrected"] == 0

    # What the loss does with such log-probs: the IS weight is truncated at C and detached, so a
    # lying generator can scale a sequence's gradient by at most C; F-TIS drops A<0 sequences whose
    # divergence is large (log-prob -40 claims an absurdly unlikely sample).
    from swarm_node.config import LossConfig
    from swarm_node.train.loss import policy_loss
    from swarm_node.train.trainer import loss_settings

    settings = loss_settings(LossConfig())
    logp = torch.full((2, 4), -2.0, requires_grad=True)  # [B, T] receiver's own log-probs
    mask = torch.ones(2, 4)
    adv = torch.tensor([1.0, -1.0])
    for lie in (0.0, -40.0):
        gen = torch.full((2, 4), lie)
        loss, s = policy_loss(logp, gen, adv, mask, **settings)
        grad, = torch.autograd.grad(loss, logp)
        honest_grad, = torch.autograd.grad(policy_loss(logp, logp.detach(), adv, mask, **settings)[0], logp)
        assert grad.abs().max() <= LossConfig().C * honest_grad.abs().max() + 1e-6
    assert s["filter/dropped_frac"] == 0.5  # the A<0 sequence with the -40 lie is filtered out


# ================================================================================ exchange with a fake transport

class FakeTransport:
    """A `Transport` whose `collect` returns whatever the test queued (plus some dropped offers)."""

    def __init__(self):
        self.peer_id, self.queue, self.distrusted, self.offered = ME, [], [], []

    def offer(self, round, policy_version, data):
        self.offered.append((round, policy_version, len(data)))
        return packet_digest(data)

    def collect(self, oldest, newest, min_peers, deadline_s):
        items, self.queue = self.queue, []
        return Collected(items, peers=2, dropped=Counter({"duplicate_round": 3, "stale": 1}))

    def distrust(self, peer, digest):
        self.distrusted.append((peer, digest))

    def credit(self, peer, useful=True, taken=True):
        pass

    def measure(self):
        pass

    def stats(self):
        return {}

    def peers(self):
        return []

    def close(self):
        pass


def test_exchange_counts_every_rejection_and_survives_internal_errors(crafted):
    policy, task, groups, expect, packet = crafted
    cfg = load_config(None, ["swarm.run_id=run", "rollout.max_new_tokens=6"])
    transport = FakeTransport()
    ex = Exchange(transport, cfg.swarm, "tiny-s", expect.tokenizer)
    admission = Admission(expect, policy.scorer(task))
    ours, theirs = groups[:1], groups[1:]  # a peer's groups are never ours (those would be an echo)
    good, impostor, garbage = packet(gs=theirs, sender=HONEST), packet(gs=theirs, sender=HONEST), b"\x00garbage"
    transport.queue = [Received(HONEST, 5, packet_digest(good), good), Received(EVIL, 5, "sha256:" + "1" * 64, impostor),
                       Received(EVIL, 4, "sha256:" + "2" * 64, garbage)]
    assert ex.offer(5, 3, ours)["swarm/packet_bytes_out"] > 0 and transport.offered[0][:2] == (5, 3)
    accepted, stats = ex.collect(5, admission)
    assert [(peer, len(p.groups)) for peer, p in accepted] == [(HONEST, len(theirs))]
    assert stats["swarm/packets_accepted"] == 1 and stats["swarm/packets_received"] == 3
    assert stats["swarm/rejected/sender_mismatch"] == 1 and stats["swarm/rejected/codec_bad_type"] == 1
    assert stats["swarm/rejected/duplicate_round"] == 3 and stats["swarm/rejected/stale"] == 1
    assert stats["swarm/packets_rejected"] == 6 and stats["swarm/peers"] == 2
    # the impostor's copy is distrusted, so the real sender's copy can still be delivered
    assert transport.distrusted == [(EVIL, "sha256:" + "1" * 64)]

    class Boom:
        def check(self, item, round_index):
            raise RuntimeError("a bug reached by hostile bytes")

        def take_stats(self):
            return {}

        def refuses(self, peer, round_index):
            return None

    transport.queue = [Received(EVIL, 6, "sha256:" + "4" * 64, good)]
    _, stats = ex.collect(6, Boom())
    assert stats["swarm/rejected/internal_error"] == 1


# ================================================================================ crash-safe files (unit)

def test_metrics_resume_drops_redone_rounds_and_heals_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"round": r}) + "\n" for r in range(6)) + '{"round": 6, "rew')  # torn by kill -9
    assert drop_rounds_after(path, 3) == 2  # rows 4 and 5 (the torn line was never a row)
    assert [r["round"] for r in read_metrics(path)] == [0, 1, 2, 3]
    path.write_text(path.read_text() + '{"round": 4, "x"')  # torn again, then a plain append
    writer = MetricsWriter(path)
    writer.write({"round": 4})
    writer.close()
    assert [r["round"] for r in read_metrics(path)] == [0, 1, 2, 3, 4]


def test_metrics_on_a_full_disk_is_a_clear_error(tmp_path):
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    writer = MetricsWriter(tmp_path / "metrics.jsonl")
    with pytest.raises(MetricsError, match="No space left on device"):
        writer.write({"round": 0})
    writer.close()  # the failure was reported once; closing does not raise again


def test_resume_after_a_crash_between_metrics_and_checkpoint(tmp_path):
    fast = ["model.name=tiny-s", "rollout.group_size=2", "rollout.max_new_tokens=4", "task.eval_limit=4",
            "train.eval_every=0", "train.checkpoint_every=1", "threads=1", "train.warmstart_steps=0", "rollout.prompts_per_round=2",
            f"out={tmp_path}"]
    from swarm_node.node import run

    run(load_config(None, fast + ["train.rounds=2"]))
    with open(tmp_path / "metrics.jsonl", "a") as f:  # round 3 logged, then killed before its checkpoint
        f.write(json.dumps({"round": 3}) + "\n" + '{"round": 4, "tor')
    rows = run(load_config(None, fast + ["train.rounds=4"]), resume=True)
    assert [r["round"] for r in rows] == [3, 4]
    assert [r["round"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_checkpoint_leftovers_and_resaves(tmp_path, tiny_policy):
    from swarm_node.config import NodeConfig
    from swarm_node.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

    opt = torch.optim.AdamW(tiny_policy.trainable_parameters(), lr=1e-3)
    root = tmp_path / "checkpoints"
    save_checkpoint(tmp_path, tiny_policy, opt, {"round": 1, "policy_version": 1}, NodeConfig())
    for junk in (".tmp-round-000002-999", ".trash-round-000000-999"):  # a killed writer's leftovers
        (root / junk / "model").mkdir(parents=True)
    (root / ".latest.tmp-999").write_text("round-000002")
    path = save_checkpoint(tmp_path, tiny_policy, opt, {"round": 1, "policy_version": 2}, NodeConfig())  # re-save
    assert sorted(p.name for p in root.iterdir()) == ["latest", "round-000001"]
    assert load_checkpoint(path, opt)["policy_version"] == 2
    (root / "latest").write_text("../../etc")  # a damaged pointer is ignored
    assert latest_checkpoint(tmp_path) == path


def test_cli_full_disk_is_one_error_line(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").symlink_to("/dev/full")
    result = CliRunner().invoke(app, ["train", "--model", "tiny-s", "--rounds", "1", "--out", str(out),
                                      "--set", "rollout.group_size=2", "--set", "rollout.max_new_tokens=4",
                                      "--set", "task.eval_limit=4", "--set", "threads=1",
                                      "--set", "train.warmstart_steps=0", "--set", "rollout.prompts_per_round=2"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "metrics.jsonl" in errors[0] and "No space left on device" in errors[0]
    assert "Traceback" not in result.output


# ================================================================================ real processes (slow)



def _rounds(rows: list[dict]) -> list[int]:
    return [r["round"] for r in rows if "ood/accuracy" not in r]


GROUP_SIZE = 12  # the run's (default) group size: the adversary's groups must match it to be admitted
ROUNDS = 30  # enough for every one of the adversary's 12 attack kinds to reach both honest nodes
ARITH_OPTIONS = {"digits": 2, "second_digits": 1}
ARITH = json.dumps(ARITH_OPTIONS)
LEARN = ["--model", "tiny-s", "--set", f"task.options={ARITH}", "--set", "train.warmstart_steps=600",
         "--set", "rollout.prompts_per_round=4", "--set", "rollout.max_new_tokens=10", "--set", "train.lr=3e-5",
         "--set", "train.micro_batch=48", "--set", "task.eval_limit=500", "--set", "train.eval_every=0",
         "--set", "train.checkpoint_every=0", "--set", "threads=1", "--rounds", str(ROUNDS),
         "--set", "swarm.deadline_s=20", "--set", "swarm.fetch_timeout_s=5", "--set", "swarm.linger_s=10",
         "--set", "swarm.alone_wait_s=null"]  # the first node waits for the second from round 1
# the attacks -> the rejection reasons they produce at the honest nodes (summed over both)
ATTACKS = {
    "(a) log-prob lies": ("codec_bad_logprob",),  # > 0 is refused; in-range lies are accepted, see `corrected`
    "(c) wrong example / prompt": ("unknown_example", "prompt_mismatch", "held_out_example"),
    "(d) flood": ("duplicate_round",), "(d) replay of old packets": ("stale",),
    "(d) lying sizes / digests": ("oversize", "digest_mismatch"),
    "(e) another peer's id": ("sender_mismatch",),
    "hostile bytes": ("codec_bad_logprob", "codec_token_out_of_range", "codec_bad_msgpack", "round_mismatch", "too_long"),
}


def _swarm_run(tmp: Path, procs, run_id: str, adversary: bool) -> tuple[list[list[dict]], dict]:
    """Two honest nodes (+ the adversary); returns each honest node's rows and the adversary's summary."""
    min_peers = ["--set", "swarm.min_peers=1", "--run-id", run_id]
    a = procs(NodeProcess.join([*LEARN, *min_peers], tmp / "a"))
    peers = ["--peers", a.address()]
    b = procs(NodeProcess.join([*LEARN, *min_peers, *peers, "--set", "train.seed=1"], tmp / "b"))
    summary: dict = {}
    if adversary:
        model = public_warm_start(600, ARITH_OPTIONS)  # the adversary's copy of the nodes' round 0
        evil = procs(NodeProcess([sys.executable, "-m", "swarm_node.harness.adversary", "--peers", peers[1],
                                  "--run-id", run_id, "--model", model, "--group-size", str(GROUP_SIZE),
                                  "--task-options", json.dumps(ARITH_OPTIONS),
                                  "--seconds", "400", "--summary", str(tmp / "adversary.json")]))
        evil.wait_line("ADVERSARY", 120)
    for node in (a, b):
        assert node.wait(400) == 0, node.text()
    if adversary:
        evil.popen.terminate()
        assert evil.wait(60) == 0, evil.text()
        summary = json.loads((tmp / "adversary.json").read_text())
    return [a.rows(), b.rows()], summary


@pytest.mark.slow
def test_malicious_peer_is_contained_and_its_effect_on_accuracy_is_bounded(tmp_path, procs):
    """(a)-(e) as a real hostile process: honest nodes keep training, every attack is counted by
    reason, and held-out accuracy with the attacker is compared with the same swarm without it."""
    public_warm_start(600, ARITH_OPTIONS)  # cached first: every node finds it
    results = {}
    for name, adversary in (("baseline", False), ("attacked", True)):
        honest, summary = _swarm_run(tmp_path / name, procs, f"rel-{name}", adversary)
        for rows in honest:
            assert _rounds(rows) == list(range(ROUNDS + 1)), (name, _rounds(rows))  # every round once, none lost
            # peer groups in nearly every round. A node behind its peer takes the peer's newer packets
            # early (staleness 2: two packets in one round, "4" groups), so its last 1-2 rounds find
            # none left (seen in 3 of 4 attacked runs, the adversary's packets pacing the rounds);
            # with one more late round that was 27 of 30 once in CI (session 20)
            # Not counted: rounds in which the node's guard refused its peer (train/guard.py). A false alarm
            # before the peer has tenure bans it and locks down for 20 rounds (once in CI, session 27)
            open_rounds = [r for r in rows[1:] if not r.get("guard/lockdown_rounds") and not r.get("guard/distrusted_peers")]
            used = [r.get("swarm/peer_groups_used", 0) for r in open_rounds]
            assert len(open_rounds) >= ROUNDS // 3 and sum(n > 0 for n in used) >= len(open_rounds) - 4, (name, used)
        results[name] = (honest, summary)

    base_rows, (att_rows, summary) = results["baseline"][0], results["attacked"]
    total = Counter()
    for rows in att_rows:
        for row in rows:
            total.update({k.split("/", 2)[2]: v for k, v in row.items() if k.startswith("swarm/rejected/")})
    rejected = sum(row.get("swarm/packets_rejected", 0) for rows in att_rows for row in rows)
    corrected = sum(row.get("swarm/rewards_corrected", 0) for rows in att_rows for row in rows)
    accepted = sum(row.get("swarm/packets_accepted", 0) for rows in att_rows for row in rows)
    start = [rows[0]["eval/accuracy"] for rows in base_rows]
    base = [rows[-1]["eval/accuracy"] for rows in base_rows]
    attacked = [rows[-1]["eval/accuracy"] for rows in att_rows]
    requests = list(summary["served"].values())
    print(f"\nattack kinds offered: {sorted(summary['kinds'])} over {len(summary['rounds'])} rounds")
    print(f"honest nodes: {accepted} packets accepted, {rejected} offers/packets rejected: {dict(total)}; "
          f"{corrected} claimed rewards corrected")
    print(f"adversary: {sum(requests)} fetch requests for {len(requests)} digests (a fetch cancelled because "
          f"another packet completed the round first is asked again later)")
    print(f"held-out pass@1 (n={base_rows[0][-1]['eval/n']}): warm start {start} -> baseline {base} (mean {np.mean(base):.3f}), "
          f"with attacker {attacked} (mean {np.mean(attacked):.3f})")
    # every attack is counted (each kind is offered until both honest nodes asked for it; a kind can
    # still lose every race against faster packets, so each attack class needs one of its reasons)
    for attack, reasons in ATTACKS.items():
        assert any(total[r] for r in reasons), (attack, dict(total))
    assert corrected > 0, dict(total)  # (b), and proof that lying-log-prob packets (a) were accepted and trained on
    # a digest is received once from each peer: the adversary's replays of kept offers never come back. Once from
    # each, not once: a copy refused for its server (sender_mismatch) lets the sender's own copy in (red team 9),
    # which may come too late and be refused as stale
    for node in ("a", "b"):
        rejected = [tuple(line.split("rejected packet ", 1)[1].split()[:3:2])  # (digest, peer)
                    for line in (tmp_path / "attacked" / node / "node.log").read_text().splitlines()
                    if "rejected packet " in line]
        twice = [d for d, n in Counter(rejected).items() if n > 1]
        assert rejected and not twice, (node, len(rejected), twice)
    # bounded effect (a short run bounds; it does not prove). Two runs of the same honest swarm differ by more than
    # the held-out sample's error: the baseline's two-node mean ended at 0.113, 0.168 and 0.170 from 0.145 (session
    # 32, n = 200; one lost 3 points with no attacker), so a 30-round mean swings about 0.03 whatever the peers. The
    # guard bounds an attacker against the node alone, at its bar (4-5 points here, train/guard.py), not against an
    # honest swarm. Bars: the warm start - 0.07 (the mean's swing and the guard's bar), the baseline - 0.09 (two
    # means' swings). With 0.06 against the baseline, one of 3 runs here passed by 0.005 (CI failed this test on
    # session 31's code; its cut log did not show which assertion).
    assert np.mean(attacked) >= np.mean(start) - 0.07, (start, attacked)  # the attacker does not undo the warm start
    assert np.mean(attacked) >= np.mean(base) - 0.09, (base, attacked)


FAULTS = ["--model", "tiny-s", "--set", "rollout.group_size=4", "--set", "rollout.max_new_tokens=8",
          "--set", "task.eval_limit=4", "--set", "train.eval_every=0", "--set", "train.checkpoint_every=1",
          "--set", "swarm.min_peers=1", "--set", "swarm.deadline_s=4", "--set", "swarm.fetch_timeout_s=2",
          "--set", "swarm.linger_s=3", "--set", "threads=1", "--run-id", "faults",
          "--set", "train.warmstart_steps=0", "--set", "rollout.prompts_per_round=2"]


@pytest.mark.slow
def test_stall_kill_9_and_restart_with_resume(tmp_path, procs):
    """B stalls (SIGSTOP), then is killed with SIGKILL mid-round, then restarts with its identity and
    --resume: A finishes every round within its deadline throughout, and takes B's packets again."""
    deadline = 4.0
    a = procs(NodeProcess.join([*FAULTS, "--identity", str(tmp_path / "a.key"), "--rounds", "200"], tmp_path / "a"))
    b_args = [*FAULTS, "--identity", str(tmp_path / "b.key"), "--peers", a.address(), "--set", "train.seed=1"]
    b = procs(NodeProcess.join([*b_args, "--rounds", "200"], tmp_path / "b"))
    b_id = b.address().rsplit("/p2p/", 1)[1]
    b.wait_rows(lambda rows: len(rows) >= 4, 120, "B's round 3")

    # ---- stall: B's node process stops (its p2pd still accepts connections and streams)
    os.kill(b.popen.pid, signal.SIGSTOP)
    n = len(a.rows())
    a.wait_rows(lambda rows: len(rows) >= n + 2, 120, "A's rounds while B stalls")
    stalled = a.rows()[n:]
    os.kill(b.popen.pid, signal.SIGCONT)

    # ---- kill -9 in the middle of a round (B's rounds take ~0.2-1 s)
    b.wait_rows(lambda rows: len(rows) >= 7, 120, "B's round 6")
    time.sleep(random.Random(0).uniform(0.05, 0.3))
    os.killpg(b.popen.pid, signal.SIGKILL)
    b.popen.wait(10)
    killed_after = max(_rounds(b.rows()))
    checkpoint = int((tmp_path / "b" / "checkpoints" / "latest").read_text().split("-")[1])
    n = len(a.rows())
    a.wait_rows(lambda rows: len(rows) >= n + 2, 120, "A's rounds after B died")
    alone = a.rows()[n:]

    # ---- restart: same identity, --resume, and enough rounds left to exchange with A however far B got
    n_restart = len(a.rows())
    last = checkpoint + 6
    b2 = procs(NodeProcess.join([*b_args, "--rounds", str(last), "--resume"], tmp_path / "b"))
    assert b2.address().rsplit("/p2p/", 1)[1] == b_id  # same peer id
    assert b2.wait(240) == 0, b2.text()
    resumed = b2.wait_line("resumed from")
    after = a.rows()[n_restart:]
    rows_b = b2.rows()

    print(f"\nA while B stalled: exchange {[round(r['time/exchange_s'], 2) for r in stalled]} s; after B died: "
          f"{[round(r['time/exchange_s'], 2) for r in alone]} s (deadline {deadline} s)")
    print(f"B killed after round {killed_after} (checkpoint {checkpoint}); {resumed.strip()}")
    for row in stalled + alone:  # A never waits for a stalled or dead peer longer than its deadline (+ DHT RPCs)
        assert row["time/exchange_s"] < deadline + 3 * 3.0 + 1.0, row
    assert f"next round {checkpoint + 1}" in resumed
    assert _rounds(rows_b) == list(range(last + 1))  # no gap, no repeat, after the restart too
    versions = [r["train/policy_version"] for r in rows_b[1:]]
    assert versions == sorted(versions)
    assert any(r.get("swarm/packets_accepted", 0) > 0 for r in after)  # A takes the restarted B's packets
    assert any(r.get("swarm/packets_accepted", 0) > 0 for r in rows_b[checkpoint + 2:])  # and B takes A's


def _staller(procs, peer: str, run_id: str, seconds: int) -> str:
    """A real staller (adversary.py --mode stall: 6 offers, never answers a fetch) joined through `peer`; its peer id."""
    staller = procs(NodeProcess([sys.executable, "-m", "swarm_node.harness.adversary", "--mode", "stall", "--offers", "6",
                                 "--peers", peer, "--run-id", run_id, "--seconds", str(seconds)]))
    return staller.wait_line("ADVERSARY", 120).split()[1]


@pytest.mark.slow
def test_a_stalled_peer_process_costs_at_most_the_fetch_timeout(procs):
    """A real peer process that accepts every fetch stream and never answers (swarm_node/harness/adversary.py
    --mode stall, 6 offers): one fetch costs the fetch timeout, it never delays an honest peer's
    packet, and a round that waits for it ends at the deadline."""
    from swarm_node.config import SwarmConfig
    from swarm_node.net.hivemind import HivemindTransport

    timeout = 2.0
    local = ["/ip4/127.0.0.1/tcp/0"]
    honest = HivemindTransport(SwarmConfig(run_id="stall", host_maddrs=local), "m", "tok")
    fetcher = None
    try:
        honest.start()
        stall_id = _staller(procs, honest.join_addrs()[0], "stall", 120)
        fetcher = HivemindTransport(SwarmConfig(run_id="stall", host_maddrs=local, peers=honest.join_addrs()[:1],
                                                fetch_timeout_s=timeout), "m", "tok")
        fetcher.start()
        data = os.urandom(50_000)
        honest.offer(1, 1, data)
        deadline = time.monotonic() + 30
        while sum(bool(p.offers) for p in fetcher.peers()) < 2:
            assert time.monotonic() < deadline, fetcher.peers()
            time.sleep(0.3)
        stalled = next(p for p in fetcher.peers() if p.peer_id == stall_id).offers

        t0 = time.monotonic()
        assert fetcher.fetch(stall_id, stalled[0][1]) is None
        one = time.monotonic() - t0
        assert one < timeout + 1.0 and fetcher.stats()["fetch_timeouts"] == 1

        t0 = time.monotonic()
        got = fetcher.collect(1, 3, min_peers=1, deadline_s=20).packets
        first = time.monotonic() - t0
        assert [r.peer_id for r in got] == [honest.peer_id] and first < timeout

        before = fetcher.stats()["fetch_timeouts"]  # the honest packet is delivered now: only the staller is left
        t0 = time.monotonic()
        assert fetcher.collect(1, 3, min_peers=1, deadline_s=6.0).packets == []
        waited, timeouts = time.monotonic() - t0, fetcher.stats()["fetch_timeouts"] - before
        print(f"\nstalled peer: one fetch {one:.2f} s (timeout {timeout} s); honest packet beside it in {first:.2f} s; "
              f"a 6 s wait for it: {waited:.2f} s, {timeouts} timed-out fetches (one at a time)")
        assert 5.9 < waited < 6.0 + 1.5 and 1 <= timeouts <= 6.0 / timeout + 1
    finally:
        for sw in (fetcher, honest):
            if sw is not None:
                sw.close()



def _hivemind(**kw):
    from swarm_node.config import SwarmConfig
    from swarm_node.net.hivemind import HivemindTransport

    return HivemindTransport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], **kw), "m", "tok")


@pytest.mark.slow
def test_a_staller_does_not_hide_an_honest_packet_published_during_the_wait(procs):
    """Issue 18 point 3: a real staller (accepts every fetch stream, never answers; 6 offers) is being
    fetched from when an honest peer publishes. The offer is seen while that fetch is pending and
    the honest packet arrives well within one fetch timeout of its publication, instead of after
    the staller's offers x fetch timeout (30 s here: the old loop re-read offers only between passes)."""
    timeout = 5.0
    honest = _hivemind(run_id="stall-late")
    fetcher = None
    try:
        honest.start()
        stall_id = _staller(procs, honest.join_addrs()[0], "stall-late", 150)
        fetcher = _hivemind(run_id="stall-late", peers=honest.join_addrs()[:1], fetch_timeout_s=timeout)
        fetcher.start()
        deadline = time.monotonic() + 60
        while not any(p.peer_id == stall_id and p.offers for p in fetcher.peers()):
            assert time.monotonic() < deadline, fetcher.peers()
            time.sleep(0.3)
        result: dict = {}

        def collect():
            t0 = time.monotonic()
            result["packets"] = fetcher.collect(1, 3, min_peers=1, deadline_s=30).packets
            result["start"], result["end"] = t0, time.monotonic()

        waiter = threading.Thread(target=collect)
        waiter.start()
        time.sleep(1.5)  # the staller's first fetch is pending now
        published = time.monotonic()
        honest.offer(2, 2, os.urandom(20_000))
        waiter.join(60)
        latency, total = result["end"] - published, result["end"] - result["start"]
        timeouts = fetcher.stats()["fetch_timeouts"]
        print(f"\nstaller + late honest publisher: honest packet delivered {latency:.2f} s after it was published "
              f"(fetch timeout {timeout} s); the collect took {total:.2f} s, {timeouts} stalled fetches timed out")
        assert [r.peer_id for r in result["packets"]] == [honest.peer_id]
        assert latency < timeout  # one stalled peer costs at most one fetch timeout; here it cost nothing
    finally:
        for sw in (fetcher, honest):
            if sw is not None:
                sw.close()


NOFILE = 1024  # the common default soft limit; the victim runs with it as its hard limit too (cannot raise)
LIMITED_JOIN = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n}));"
                "runpy.run_module('swarm_node', run_name='__main__', alter_sys=True)").format(n=NOFILE)
VICTIM = ["--model", "tiny-s", "--set", "train.warmstart_steps=0", "--set", "rollout.prompts_per_round=2", "--set", "rollout.group_size=4",
          "--set", "rollout.max_new_tokens=10", "--set", "task.eval_limit=4", "--set", "train.eval_every=0",
          "--set", "train.checkpoint_every=0", "--set", "swarm.min_peers=1", "--set", "swarm.deadline_s=4",
          "--set", "swarm.linger_s=0", "--set", "threads=1",
          "--set", "swarm.alone_wait_s=null"]  # it starts the swarm, and must wait its full deadline for peers


def _fds_and_memory(pid: int) -> tuple[int, int, int]:
    """(open fds of the node, of its p2pd, p2pd RSS bytes)."""
    node = psutil.Process(pid)
    p2pd = [c for c in node.children() if "p2pd" in c.name()]
    return node.num_fds(), sum(c.num_fds() for c in p2pd), sum(c.memory_info().rss for c in p2pd)


@pytest.mark.slow
def test_ten_thousand_held_open_streams_leave_fds_and_logs_bounded(tmp_path, procs):
    """Issue 18 point 5: a real hostile process opens 10,000 fetch streams to a `swarm-node join` node
    (2,000 held at once, never sending a request) while the node runs with a 1,024 open-files limit.
    Streams beyond 4 per peer are answered busy at once (and once 200 came within 2 s, the public fetch id is
    shut and p2pd refuses the rest), so the node's fds, its p2pd's, and its log stay bounded, and it keeps
    training. (Before: 7,949 fds and 48 MB of node.log in 90 s.)"""
    node = procs(NodeProcess([sys.executable, "-c", LIMITED_JOIN, "join", "--out", str(tmp_path / "node"),
                              "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--run-id", "streams", "--rounds", "400", *VICTIM],
                             tmp_path / "node"))
    address = node.address()
    node.wait_rows(lambda rows: len(rows) >= 2, 180, "the node's first rounds")
    log = tmp_path / "node" / "node.log"
    log_before, out_before, rounds_before = log.stat().st_size, len(node.text(10**9)), len(node.rows())
    base = _fds_and_memory(node.popen.pid)
    attacker = procs(NodeProcess([sys.executable, "-m", "swarm_node.harness.adversary", "--mode", "streams", "--streams", "10000",
                                  "--concurrency", "2000", "--peers", address, "--run-id", "streams", "--seconds", "120"]))
    peak = list(base)
    while attacker.popen.poll() is None:
        peak = [max(a, b) for a, b in zip(peak, _fds_and_memory(node.popen.pid))]
        time.sleep(0.2)
    assert attacker.wait(10) == 0, attacker.text()
    report = json.loads(attacker.wait_line("STREAMS").split(" ", 1)[1])
    time.sleep(2)
    log_growth, out_growth = log.stat().st_size - log_before, len(node.text(10**9)) - out_before
    rounds = len(node.rows()) - rounds_before
    print(f"\n{report['opened']} streams opened in {report['seconds']:.1f} s ({report['ends']}; at most "
          f"{report['max_open']} open at once on the attacker's side, median {report['held_median_s']:.2f} s until the "
          f"node closed one); node fds {base[0]} -> peak {peak[0]} (limit {NOFILE}), p2pd fds {base[1]} -> {peak[1]}, "
          f"p2pd RSS {base[2] / 2**20:.0f} -> {peak[2] / 2**20:.0f} MB; node.log +{log_growth} B, output "
          f"+{out_growth} B; {rounds} rounds trained meanwhile")
    # refused, not held: since session 34 most inside p2pd, once the flood shut the public fetch id (net/shield.py)
    shields = sum(r.get("swarm/shields", 0) for r in node.rows())
    assert report["opened"] + report["ends"].get("open_failed", 0) >= 9_000 and report["ends"].get("held", 0) <= 8
    assert report["opened"] >= 9_000 or (shields >= 1 and report["ends"].get("open_failed", 0) > 0)
    assert peak[0] < 600 and peak[1] < 1_000 and peak[2] < 512 * 2**20
    assert log_growth < 64 * 1024 and out_growth < 64 * 1024
    assert "Too many open files" not in log.read_text() + node.text(10**9)
    assert rounds >= 1 and node.popen.poll() is None


HOSTILE_VICTIM = [*VICTIM, "--set", "swarm.deadline_s=6", "--set", "rollout.prompts_per_round=2"]


def _victim_and_hostile(tmp_path, procs, run_id: str, mode: list[str], rounds: int) -> tuple[list[dict], dict]:
    """A `swarm-node join` node and one hostile peer process (`adversary.py` with `mode`) for `rounds` rounds."""
    node = procs(NodeProcess.join([*HOSTILE_VICTIM, "--run-id", run_id, "--rounds", str(rounds)], tmp_path / "node"))
    evil = procs(NodeProcess([sys.executable, "-m", "swarm_node.harness.adversary", *mode, "--peers", node.address(),
                              "--run-id", run_id, "--seconds", "400", "--until-round", str(rounds),
                              "--summary", str(tmp_path / "adversary.json")]))
    evil.wait_line("ADVERSARY", 180)
    assert node.wait(400) == 0, node.text()
    evil.popen.terminate()
    evil.wait(60)
    return node.rows(), json.loads((tmp_path / "adversary.json").read_text())


def _total(rows: list[dict], key: str) -> int:
    return sum(row.get(key, 0) for row in rows)


@pytest.mark.slow
def test_a_peer_echoing_our_own_packets_is_rejected_and_never_ends_the_wait(tmp_path, procs):
    """Issue 18 point 6: a real peer fetches the node's packets, re-signs them as its own (sender, created_at,
    claimed rewards) and offers them back: each is rejected, none is trained on, and a round with only
    echoes waits for a real peer until its deadline. Rejected as `unscheduled` since prompts follow a
    public schedule (our problems are not on the echoing peer's, SPEC 14.5), else as `echo`; the echo
    check itself: tests/test_admit.py, tests/test_exchange.py."""
    rows, summary = _victim_and_hostile(tmp_path, procs, "echo", ["--mode", "echo"], rounds=8)
    reasons = ("swarm/rejected/echo", "swarm/rejected/unscheduled")
    echoes = sum(_total(rows, key) for key in reasons)
    waits = [round(r["time/exchange_s"], 1) for r in rows if any(r.get(key) for key in reasons)]
    print(f"\nechoes offered {len(summary['kinds'].get('echo', []))}, rejected as echo {_total(rows, reasons[0])}, "
          f"as unscheduled {_total(rows, reasons[1])}, accepted "
          f"{_total(rows, 'swarm/packets_accepted')}; exchange time of rounds with echoes {waits} s (deadline 6 s)")
    assert echoes >= 2 and _total(rows, "swarm/packets_accepted") == 0 and _total(rows, "swarm/peer_groups_used") == 0
    assert all(w >= 5.9 for w in waits)  # an echo never ends the wait


@pytest.mark.slow
def test_64_completion_groups_from_a_peer_are_rejected(tmp_path, procs):
    """Issue 18 point 4: a real peer offers valid packets (the task's prompts, real completions) whose groups
    hold 64 completions where the run samples 4: each is rejected as `group_size`, so the node's
    training compute per step stays its own (the attack made a step train 1,560 sequences instead of 48)."""
    rows, summary = _victim_and_hostile(tmp_path, procs, "amplify", ["--mode", "amplify", "--group-size", "64"],
                                        rounds=6)
    offered, rejected = len(summary["kinds"].get("amplify", [])), _total(rows, "swarm/rejected/group_size")
    sequences = max(r.get("train/sequences", 0) for r in rows)
    print(f"\n64-completion packets offered {offered}, rejected as group_size {rejected}, accepted "
          f"{_total(rows, 'swarm/packets_accepted')}; largest training step {sequences} sequences (own: 2 x 4)")
    assert rejected >= 1 and _total(rows, "swarm/packets_accepted") == 0 and _total(rows, "swarm/completions_in") == 0
    assert sequences <= 2 * 4


CHECKPOINT_KILLER = textwrap.dedent("""
    import json, os, random, signal, sys, threading, time
    from pathlib import Path
    import torch
    import tqdm
    import transformers
    torch.set_num_threads(1)
    # A writer killed inside a progress bar would hold tqdm's cross-process lock forever: no bars, thread lock.
    transformers.utils.logging.disable_progress_bar()
    tqdm.tqdm.set_lock(threading.RLock())
    from swarm_node.train.policy import Policy
    from swarm_node.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from swarm_node.config import ModelConfig, NodeConfig

    out, trials = Path(sys.argv[1]), int(sys.argv[2])
    policy = Policy.load(ModelConfig(name="tiny-l"))  # 2.6 M parameters: ~30 MB with the AdamW state
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    sum(p.sum() for p in policy.model.parameters()).backward()
    opt.step()
    weights = {k: v.clone() for k, v in policy.model.state_dict().items()}
    t0 = time.perf_counter()
    save_checkpoint(out, policy, opt, {"round": 0, "policy_version": 0}, NodeConfig())
    one = time.perf_counter() - t0
    rng, results, next_round = random.Random(0), [], 1
    for trial in range(trials):
        pid = os.fork()
        if pid == 0:  # the writer: saves round after round until it is killed
            r = next_round
            while True:
                save_checkpoint(out, policy, opt, {"round": r, "policy_version": r}, NodeConfig())
                r += 1
        time.sleep(rng.uniform(0.0, 2.5 * one))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        leftovers = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("."))
        path = latest_checkpoint(out)  # must be complete and loadable, whatever the moment of the kill
        state = load_checkpoint(path, opt)
        reloaded = Policy.load(ModelConfig(name=str(path / "model"))).model.state_dict()
        assert all(torch.equal(reloaded[k], v) for k, v in weights.items()), path
        results.append({"round": state["round"], "leftovers": leftovers})
        next_round = state["round"] + 1  # sometimes re-saves a round whose directory exists: the resume case
    print(json.dumps({"save_s": one, "trials": results}))
""")


@pytest.mark.slow
def test_kill_9_during_checkpoint_writes_leaves_a_loadable_checkpoint(tmp_path):
    trials = 30
    proc = subprocess.run([sys.executable, "-c", CHECKPOINT_KILLER, str(tmp_path), str(trials)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    results = report["trials"]
    torn = sum(bool(r["leftovers"]) for r in results)
    rounds = [r["round"] for r in results]
    print(f"\n{trials} SIGKILLs of a checkpoint writer (one save {report['save_s']:.2f} s): every time the latest "
          f"checkpoint loaded (model weights bit-identical); {torn} kills left a torn temp/trash directory behind")
    assert len(results) == trials and rounds == sorted(rounds)
    assert torn >= 3  # the kills did land mid-write


def _in_mount_namespace(script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) not available")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace here: {probe.stderr.decode().strip()}")
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


TRAIN = f"{sys.executable} -m swarm_node train --model tiny-s --rounds 3 --set rollout.group_size=2 " \
        "--set rollout.max_new_tokens=4 --set task.eval_limit=4 --set train.checkpoint_every=1 --set threads=1 --set train.warmstart_steps=0 --set rollout.prompts_per_round=2"


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


@pytest.mark.slow
def test_disk_full_and_read_only_output_are_one_clear_error(tmp_path):
    """Root-proof: a 256 KiB tmpfs (room for the logs, not for a checkpoint) and a read-only tmpfs,
    each mounted in a private mount namespace (unshare -m) so nothing leaks into the host."""
    out = tmp_path / "out"
    out.mkdir()
    full = _in_mount_namespace(f"""
        mount -t tmpfs -o size=256k tmpfs {out} || exit 90
        {TRAIN} --out {out}; echo "rc=$?"
        ls -A {out}/checkpoints; echo "rows=$(wc -l < {out}/metrics.jsonl)"
    """)
    assert "rc=2" in full.stdout, (full.stdout, full.stderr[-3000:])
    error = _one_error_line(full.stderr)
    assert "cannot write checkpoint" in error and "No space left on device" in error
    assert "rows=2" in full.stdout  # rounds 0 and 1 are recorded; the round whose checkpoint failed says so
    listing = full.stdout.split("rc=2", 1)[1].split("rows=", 1)[0].split()
    assert listing == []  # the failed write left no temp directory behind

    ro = _in_mount_namespace(f"""
        mount -t tmpfs -o ro tmpfs {out} || exit 90
        {TRAIN} --out {out}; echo "rc=$?"
        {sys.executable} -m swarm_node join --model tiny-s --rounds 1 --out {out} --set threads=1 --set train.warmstart_steps=0 --set rollout.prompts_per_round=2; echo "rc=$?"
    """)
    assert ro.stdout.split() == ["rc=2", "rc=2"], (ro.stdout, ro.stderr[-3000:])
    errors = [line for line in ro.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all("Read-only file system" in e for e in errors) and "Traceback" not in ro.stderr

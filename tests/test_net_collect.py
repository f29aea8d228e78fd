"""net/collect.py: the collect loop and the transport's delivery memory, with fake peers (no network).

Stalls: offers re-read while fetches are pending, stallers resting; the per-peer limits (flood, byte
budget, replays) are covered in test_reliability.py."""
from __future__ import annotations

import asyncio
import time
from collections import Counter

from swarm_node.net import PeerInfo
from swarm_node.net.collect import MAX_REMEMBERED, CollectLimits, Delivery, collect_offers
from swarm_node.wire.codec import digest as packet_digest

LIMITS = CollectLimits(fetch_timeout_s=1.0, max_packet_bytes=16 * 2**20, max_peer_packets=4, max_peer_bytes=32 * 2**20,
                       poll_s=0.05)


def _peer(pid: str, offers, round_: int = 1) -> PeerInfo:
    return PeerInfo(pid, "m", "t", 1, round_, 1, list(offers), 0.0)


def _lister(peers):
    async def list_peers(timeout):
        return peers
    return list_peers


def test_collect_is_deadline_bounded_deduplicated_and_remembers_deliveries():
    data = b"d" * 2_500_000
    d = packet_digest(data)
    fake = packet_digest(b"promised")
    offers = [(1, d, len(data)), (2, fake, 11), (9, packet_digest(b"x"), 1)]
    peers = [_peer("QmA", offers), _peer("QmB", offers)]
    calls = []

    async def fake_fetch(peer, digest, timeout, size):
        calls.append((peer, digest))
        return (data, "ok") if digest == d else (None, "mismatch")

    async def main():
        state = Delivery()
        kw = dict(wanted=lambda r: r < 5)
        t0 = time.monotonic()
        got = await collect_offers(_lister(peers), fake_fetch, LIMITS, state, min_count=5, deadline_s=0.5, **kw)
        assert 0.45 < time.monotonic() - t0 < 1.0
        assert [(g.peer_id, g.digest, g.data == data) for g in got.packets] == [("QmA", d, True)]
        assert set(state.delivered) == {d} and got.peers == 2
        assert (("QmA", packet_digest(b"x")) not in calls) and calls.count(("QmA", d)) == 1
        assert got.dropped == Counter({"digest_mismatch": 2})  # once per (peer, digest), whatever the retries
        assert got.failed == {"QmA", "QmB"}  # the peers whose fetches failed (the exchange's fair wait reads it)
        got = await collect_offers(_lister(peers), fake_fetch, LIMITS, Delivery(), min_count=0, deadline_s=5, **kw)
        assert len(got.packets) == 1  # min_count=0: one pass, then return

    asyncio.run(main())


def test_stale_offers_are_counted_once_and_never_fetched_even_at_deadline_zero():
    """Counted once per peer that offers one (two here), never fetched."""
    stale, fresh = packet_digest(b"old"), packet_digest(b"new")
    peers = [_peer("QmA", [(2, stale, 3), (5, fresh, 3)], round_=5), _peer("QmB", [(2, stale, 3)], round_=5)]
    fetched = []

    async def fetch(peer, digest, timeout, size):
        fetched.append(digest)
        return b"new", "ok"

    async def main():
        state = Delivery()
        window = dict(wanted=lambda r: 4 <= r <= 6, oldest=4, newest=6)
        got = await collect_offers(_lister(peers), fetch, LIMITS, state, min_count=1, deadline_s=0, **window)
        assert got.packets == [] and got.dropped == Counter({"stale": 2}) and got.peers == 2 and fetched == []
        got = await collect_offers(_lister(peers), fetch, LIMITS, state, min_count=1, deadline_s=2, **window)
        assert [g.digest for g in got.packets] == [fresh] and got.dropped == Counter() and fetched == [fresh]

    asyncio.run(main())


def test_own_digest_is_never_delivered_and_distrust_lets_another_peer_deliver():
    mine, theirs = packet_digest(b"mine"), packet_digest(b"theirs")
    peers = [_peer("QmEvil", [(1, mine, 4), (1, theirs, 6)]), _peer("QmHonest", [(2, theirs, 6)])]
    body = {mine: b"mine", theirs: b"theirs"}

    async def fetch(peer, digest, timeout, size):
        return body[digest], "ok"

    async def main():
        state = Delivery()
        state.own(mine, 1)
        got = await collect_offers(_lister(peers[:1]), fetch, LIMITS, state, wanted=lambda r: True, min_count=1,
                                   deadline_s=2)
        assert [(g.peer_id, g.digest) for g in got.packets] == [("QmEvil", theirs)]
        state.distrust("QmEvil", theirs)  # e.g. the packet names another sender
        assert theirs not in state.delivered
        got = await collect_offers(_lister(peers), fetch, LIMITS, state, wanted=lambda r: True, min_count=1,
                                   deadline_s=2)
        assert [(g.peer_id, g.digest) for g in got.packets] == [("QmHonest", theirs)]

    asyncio.run(main())


def test_delivery_memory_is_bounded():
    state = Delivery()
    for i in range(MAX_REMEMBERED + 10):
        state.delivered[f"d{i}"] = i
        state.taken[("p", i)] = f"d{i}"
        state.counted.add(("p", f"d{i}", "flood"))
        state.retry_at[("p", f"d{i}")] = 5.0 if i % 2 else 50.0
        state.rest_until[f"p{i}"] = 50.0
        state.failed_at[f"p{i}"] = 10.0 - 30 if i % 3 else 10.0 - 90  # FAILED_LAST_S (60 s) ago: expired
        state.distrust("p", f"lie{i}")
    state.bound(now=10.0)
    # full, the distrust memory still records the newest liar (until red team 7 it stopped recording, and every
    # new lie was fetched again at each call), and forgets the oldest
    assert len(state.distrusted) == MAX_REMEMBERED and ("p", f"lie{MAX_REMEMBERED + 9}") in state.distrusted
    assert ("p", "lie9") not in state.distrusted
    assert len(state.delivered) == len(state.taken) == MAX_REMEMBERED and not state.counted
    assert len(state.retry_at) == (MAX_REMEMBERED + 10) // 2 and min(state.retry_at.values()) == 50.0  # expired went
    assert len(state.rest_until) == MAX_REMEMBERED and 0 < len(state.failed_at) < MAX_REMEMBERED
    assert min(state.failed_at.values()) == 10.0 - 30
    assert "d9" not in state.delivered and f"d{MAX_REMEMBERED + 9}" in state.delivered  # oldest went first
    state.forget_before(MAX_REMEMBERED)
    assert sorted(state.delivered.values()) == list(range(MAX_REMEMBERED, MAX_REMEMBERED + 10))


def _staller(fetched: list):
    """A fetch that stalls for QmStall (until its timeout) and answers everyone else at once."""
    async def fetch(peer, digest, timeout, size):
        fetched.append((peer, digest))
        if peer.startswith("QmStall"):
            await asyncio.sleep(timeout)
            return None, "timeout"
        return b"honest", "ok"
    return fetch


def test_an_offer_published_while_a_fetch_stalls_is_fetched_within_a_poll():
    """Offers are re-read while a fetch is pending: a packet published 0.3 s into the call, beside a
    staller whose fetch takes the whole 5 s timeout, arrives about one poll interval later."""
    honest = packet_digest(b"honest")
    staller = _peer("QmStall", [(1, packet_digest(b"s%d" % i), 10) for i in range(4)])
    listed = [staller]
    fetched = []

    async def list_peers(timeout):
        return list(listed)

    async def publish_later():
        await asyncio.sleep(0.3)
        listed.append(_peer("QmHonest", [(1, honest, 6)]))

    async def main():
        limits = CollectLimits(fetch_timeout_s=5.0, max_packet_bytes=2**20, max_peer_packets=4, max_peer_bytes=2**20,
                               poll_s=0.1)
        publisher = asyncio.create_task(publish_later())
        t0 = time.monotonic()
        got = await collect_offers(list_peers, _staller(fetched), limits, Delivery(), wanted=lambda r: True,
                                   min_count=1, deadline_s=20)
        elapsed = time.monotonic() - t0
        await publisher
        assert [(g.peer_id, g.digest) for g in got.packets] == [("QmHonest", honest)]
        assert 0.3 <= elapsed < 0.3 + 0.1 + 0.3  # published at 0.3 s, one poll (0.1 s), slack for a slow CI
        assert [p for p, _ in fetched].count("QmStall") == 1  # one stalled fetch at a time, never the whole call

    asyncio.run(main())


def test_stallers_filling_every_slot_delay_an_honest_packet_by_one_fetch_timeout_at_most():
    """3 stallers, 2 slots: both slots stall for the fetch timeout, then the stallers rest for as long
    and the honest peer's packet takes a slot."""
    stallers = [_peer(f"QmStall{i}", [(1, packet_digest(b"s%d" % i), 10)]) for i in range(3)]
    honest = _peer("QmHonest", [(1, packet_digest(b"honest"), 6)])
    fetched = []

    async def main():
        limits = CollectLimits(fetch_timeout_s=0.5, max_packet_bytes=2**20, max_peer_packets=4, max_peer_bytes=2**20,
                               max_parallel=2, poll_s=0.05)
        t0 = time.monotonic()
        got = await collect_offers(_lister([*stallers, honest]), _staller(fetched), limits, Delivery(),
                                   wanted=lambda r: True, min_count=1, deadline_s=10)
        elapsed = time.monotonic() - t0
        assert [g.peer_id for g in got.packets] == ["QmHonest"]
        assert 0.5 <= elapsed < 0.5 + 0.3
        asked = Counter(p for p, _ in fetched)  # the first two stalled once each, then rested; never asked again
        assert asked["QmStall0"] == asked["QmStall1"] == asked["QmHonest"] == 1
        assert got.failed == {"QmStall0", "QmStall1"}  # timed out; QmStall2 was never asked

    asyncio.run(main())


def test_stallers_filling_every_slot_do_not_hold_up_a_peer_named_first():
    """The same 3 stallers fill both slots; then the honest peer offers, one whose packets our steps
    took (`first`): it has slots of its own, and its packet arrives within a poll, not a fetch timeout."""
    stallers = [_peer(f"QmStall{i}", [(1, packet_digest(b"s%d" % i), 10)]) for i in range(3)]
    honest = _peer("QmHonest", [(1, packet_digest(b"honest"), 6)])

    async def main():
        limits = CollectLimits(fetch_timeout_s=1.0, max_packet_bytes=2**20, max_peer_packets=4, max_peer_bytes=2**20,
                               max_parallel=2, poll_s=0.05)
        t0 = time.monotonic()

        async def list_peers(timeout):  # the honest offer comes 0.1 s after the stallers took the slots
            return stallers + ([honest] if time.monotonic() - t0 > 0.1 else [])
        got = await collect_offers(list_peers, _staller([]), limits, Delivery(), wanted=lambda r: True,
                                   min_count=1, deadline_s=10, first={"QmHonest"}.__contains__)
        assert [g.peer_id for g in got.packets] == ["QmHonest"] and time.monotonic() - t0 < 0.4

    asyncio.run(main())


def test_a_refusing_or_failing_peer_waits_out_its_backoff_across_calls():
    """The exchange calls collect every 0.25 s while it waits: a peer that answered `busy` (nothing
    asked of it for 0.5 s, whatever it offers) or whose fetch broke (rest 2 s) is not asked again by
    the next call, and the broken one is marked to be fetched after the others (before: each call
    forgot all of it, and a busy peer was asked for each of its offers back to back)."""
    busy = _peer("QmBusy", [(1, packet_digest(b"b"), 6), (2, packet_digest(b"b2"), 6)])
    broken = _peer("QmBroken", [(1, packet_digest(b"x"), 6)])
    asked = Counter()

    async def fetch(peer, digest, timeout, size):
        asked[peer] += 1
        return None, ("busy" if peer == "QmBusy" else "error")

    async def main():
        state = Delivery()
        for _ in range(4):  # 4 calls of 0.05 s within 0.3 s
            got = await collect_offers(_lister([busy, broken]), fetch, LIMITS, state, wanted=lambda r: True,
                                       min_count=1, deadline_s=0.05)
            assert got.packets == []
        assert asked == Counter({"QmBusy": 1, "QmBroken": 1})
        assert set(state.failed_at) == {"QmBroken"} and "QmBroken" in state.rest_until
        await asyncio.sleep(0.5)  # busy's backoff is over, broken rests for 2 s
        await collect_offers(_lister([busy, broken]), fetch, LIMITS, state, wanted=lambda r: True, min_count=1,
                             deadline_s=0.05)
        assert asked == Counter({"QmBusy": 2, "QmBroken": 1})

    asyncio.run(main())


def test_a_peer_whose_fetch_failed_is_fetched_after_the_others_until_it_delivers():
    """One slot: the peer whose earlier fetch broke waits behind a fresh one, in a later call too; once
    it delivers it is one of the others again."""
    a, b = packet_digest(b"a"), packet_digest(b"b")
    order = []

    async def fetch(peer, digest, timeout, size):
        order.append(peer)
        return (b"a" if peer == "QmA" else b"b"), "ok"

    async def main():
        limits = CollectLimits(fetch_timeout_s=1.0, max_packet_bytes=2**20, max_peer_packets=4, max_peer_bytes=2**20,
                               max_parallel=1, poll_s=0.05)
        state = Delivery()
        state.failed_at["QmA"] = asyncio.get_running_loop().time() - 5  # an earlier call's fetch of QmA broke
        peers = [_peer("QmA", [(1, a, 1)]), _peer("QmB", [(1, b, 1)])]
        await collect_offers(_lister(peers), fetch, limits, state, wanted=lambda r: True, min_count=2, deadline_s=2)
        assert order == ["QmB", "QmA"] and not state.failed_at  # delivered: no longer put last

    asyncio.run(main())


def test_a_sybil_that_re_offers_a_credited_peers_digest_and_stalls_it_does_not_hold_it_up():
    """A staller offers the honest peer's digest 0.1 s before the honest peer does (it learnt it first)
    and holds its fetch open; the honest peer, named `first` and with a broken fetch a few seconds ago,
    is asked for the same digest at once (before: not until the staller's fetch timed out)."""
    d = packet_digest(b"honest")
    stallers = [_peer(f"QmStall{i}", [(1, d, 6)]) for i in range(3)]
    honest = _peer("QmHonest", [(1, d, 6)])
    fetched = []

    async def main():
        limits = CollectLimits(fetch_timeout_s=2.0, max_packet_bytes=2**20, max_peer_packets=4, max_peer_bytes=2**20,
                               poll_s=0.05)
        state = Delivery()
        state.failed_at["QmHonest"] = asyncio.get_running_loop().time() - 3
        t0 = time.monotonic()

        async def list_peers(timeout):
            return stallers + ([honest] if time.monotonic() - t0 > 0.1 else [])
        got = await collect_offers(list_peers, _staller(fetched), limits, state, wanted=lambda r: True,
                                   min_count=1, deadline_s=10, first={"QmHonest"}.__contains__)
        assert [g.peer_id for g in got.packets] == ["QmHonest"] and time.monotonic() - t0 < 0.5
        assert [p for p, _ in fetched] == ["QmStall0", "QmHonest"]  # one staller at a time holds a digest

    asyncio.run(main())


def test_a_slow_peer_listing_does_not_hold_up_fetches_in_flight():
    """A lookup that takes 2 s (e.g. a crowded DHT key) runs beside the fetches: a packet whose fetch
    finishes meanwhile ends the call at once."""
    good = packet_digest(b"good")
    calls = []

    async def list_peers(timeout):
        calls.append(time.monotonic())
        if len(calls) > 1:
            await asyncio.sleep(min(2.0, timeout))
        return [_peer("QmSlow", [(1, good, 4)])]

    async def fetch(peer, digest, timeout, size):
        await asyncio.sleep(0.3)
        return b"good", "ok"

    async def main():
        t0 = time.monotonic()
        got = await collect_offers(list_peers, fetch, LIMITS, Delivery(), wanted=lambda r: True, min_count=1,
                                   deadline_s=10)
        assert [g.digest for g in got.packets] == [good] and time.monotonic() - t0 < 0.6

    asyncio.run(main())


def test_a_node_behind_returns_early_even_beside_a_relay():
    """Peers all past the wanted rounds: collect returns at once, also when a relay (round 0, no
    offers, never past anything) is listed; with only the relay listed it waits its deadline."""
    ahead = _peer("QmAhead", [(50, packet_digest(b"new"), 3)], round_=50)
    relay = _peer("QmRelay", [], round_=0)

    async def no_fetch(peer, digest, timeout, size):
        raise AssertionError("nothing wanted is offered")

    async def timed(peers) -> float:
        t0 = time.monotonic()
        await collect_offers(_lister(peers), no_fetch, LIMITS, Delivery(), wanted=lambda r: 8 <= r <= 10,
                             min_count=1, deadline_s=1.0, oldest=8, newest=10)
        return time.monotonic() - t0

    assert asyncio.run(timed([ahead, relay])) < 0.3
    assert asyncio.run(timed([relay])) >= 0.95


def test_a_peers_packet_budget_is_per_round_not_per_collect_call():
    """Red team 9: the exchange makes up to 256 collect calls a round, and each had a fresh per-peer
    budget: one id that re-announced a newer round (its lagging newest, wanted once each) every 0.25 s
    was fetched 11 times, 88 MiB, in a 4 s round. The budget now holds for the round's window."""
    import dataclasses

    limits = dataclasses.replace(LIMITS, max_lag=64)
    fetched = []

    async def fetch(peer, d, timeout, size):
        fetched.append(d)
        return d.encode(), "ok"

    async def main():
        state = Delivery()
        window = dict(wanted=lambda r: 4 <= r <= 6, oldest=4, newest=6)
        for newest in range(20, 30):  # ten calls in one round, each listing a new newest round of the id
            evil = _peer("QmEvil", [(newest, f"sha256:{newest}", 1000)], round_=newest)
            await collect_offers(_lister([evil]), fetch, limits, state, min_count=1, deadline_s=0.2, **window)
        assert len(fetched) == LIMITS.max_peer_packets
        next_round = dict(wanted=lambda r: 5 <= r <= 7, oldest=5, newest=7)
        evil = _peer("QmEvil", [(40, "sha256:40", 1000)], round_=40)
        got = await collect_offers(_lister([evil]), fetch, limits, state, min_count=1, deadline_s=0.2, **next_round)
        assert [x.digest for x in got.packets] == ["sha256:40"]  # a new round, a new budget

    asyncio.run(main())


def test_a_third_party_offering_an_honest_digest_as_stale_does_not_block_its_sender():
    """Red team 9: a neighbour that learnt H's digest offered it for an old round (with a far newer
    offer of its own, so that one was not its lagging newest). Stale offers marked the digest delivered,
    so H's own offer of it was never fetched, H delivered nothing and lost its slot. Now a stale offer
    is only counted, for the peer that made it."""
    honest = b"h's packet"
    digest = packet_digest(honest)
    peers = [_peer("QmA", [(1, digest, len(honest)), (60, packet_digest(b"junk"), 4)], round_=60),
             _peer("QmH", [(5, digest, len(honest))], round_=5)]
    fetched = []

    async def fetch(peer, d, timeout, size):
        fetched.append((peer, d))
        return (honest, "ok") if (peer, d) == ("QmH", digest) else (None, "not_found")

    async def main():
        state = Delivery()
        window = dict(wanted=lambda r: 4 <= r <= 6, oldest=4, newest=6)
        for _ in range(3):  # the third party re-offers it at every listing
            got = await collect_offers(_lister(peers), fetch, LIMITS, state, min_count=1, deadline_s=1, **window)
            if got.packets:
                break
        assert [(x.peer_id, x.digest) for x in got.packets] == [("QmH", digest)]
        assert ("QmA", digest) not in fetched

    asyncio.run(main())


def test_a_senders_copy_that_came_second_is_fetched_again_once_the_first_copy_is_refused():
    """Red team 11: a banned id's copy of an honest peer's packet finished first; the sender's own fetch of
    it, in flight beside it, finished second and was dropped but still recorded as the sender's packet of
    the round, so once the copy was refused and the digest un-seen, the sender's offer was never fetched."""
    data = b"honest packet"
    digest = packet_digest(data)
    listings = [0]

    async def list_peers(timeout):  # the copier's offer reaches us one listing before the sender's own
        listings[0] += 1
        return [_peer("QmBanned", [(1, digest, len(data))])] + (
            [_peer("QmHonest", [(1, digest, len(data))])] if listings[0] > 1 else [])

    async def fetch(peer, d, timeout, size):
        await asyncio.sleep(0.1 if peer == "QmBanned" else 0.3)
        return data, "ok"

    async def main():
        state = Delivery()
        kw = dict(wanted=lambda r: r == 1, oldest=1, newest=1, first={"QmHonest"}.__contains__)
        got = await collect_offers(list_peers, fetch, LIMITS, state, min_count=2, deadline_s=0.6, **kw)
        assert [g.peer_id for g in got.packets] == ["QmBanned"]
        state.distrust("QmBanned", digest)  # what the exchange does when admission refuses it for its server
        got = await collect_offers(list_peers, fetch, LIMITS, state, min_count=1, deadline_s=0.6, **kw)
        assert [g.peer_id for g in got.packets] == ["QmHonest"]

    asyncio.run(main())


def test_a_fetch_left_running_when_a_round_ends_is_adopted_by_the_next_call_never_asked_again():
    """Issue 28: a round that ended on a faster packet cancelled the slower fetch, and the next round
    asked the same peer for the same digest again (4 times in 1.3 s). Each digest is fetched once."""
    fast_data, slow_data, late_data = b"fast", b"slow", b"late"
    fast, slow, late = (packet_digest(x) for x in (fast_data, slow_data, late_data))
    peers = [_peer("QmFast", [(5, fast, 4)], round_=5), _peer("QmSlow", [(5, slow, 4)], round_=5),
             _peer("QmLate", [(4, late, 4)], round_=5)]
    calls = Counter()
    served = {fast: fast_data, slow: slow_data, late: late_data}
    delay = {fast: 0.0, slow: 0.3, late: 0.3}

    async def fetch(peer, digest, timeout, size):
        calls[digest] += 1
        await asyncio.sleep(delay[digest])
        return served[digest], "ok"

    async def main():
        state = Delivery()
        window = dict(wanted=lambda r: 4 <= r <= 6, oldest=4, newest=6)
        got = await collect_offers(_lister(peers), fetch, LIMITS, state, min_count=1, deadline_s=5, **window)
        assert [x.digest for x in got.packets] == [fast]  # ended on the fast packet; slow and late in flight
        assert len(state.pending) == 2
        # the next round (window 5..7): the slow fetch is adopted, not asked again; late's round 4 is stale now
        next_round = dict(wanted=lambda r: 5 <= r <= 7, oldest=5, newest=7)
        got = await collect_offers(_lister(peers), fetch, LIMITS, state, min_count=1, deadline_s=5, **next_round)
        assert [(x.peer_id, x.data) for x in got.packets] == [("QmSlow", slow_data)]
        stale = got.dropped["stale"]
        await asyncio.sleep(0.4)
        got = await collect_offers(_lister(peers), fetch, LIMITS, state, min_count=1, deadline_s=0.3, **next_round)
        assert got.packets == [] and stale + got.dropped["stale"] == 1 and state.taken[("QmLate", 4)] == late
        assert calls == Counter({fast: 1, slow: 1, late: 1}) and not state.pending

    asyncio.run(main())


def test_a_slower_or_faster_peers_newest_offer_is_taken_once_and_its_older_ones_never():
    """Vertical mode, swarm.max_lag: a node 4x slower than its neighbours fell out of their window for
    good (and they out of its). Now a peer's newest offer outside the window, within max_lag, is wanted:
    fetched once (also after the delivery memory forgot its digest), its older offers stay stale, an
    offer beyond max_lag is not wanted; each counts toward the call's peers like any packet."""
    import dataclasses

    slow_old, slow_new, fast, far = (packet_digest(x) for x in (b"slow-old", b"slow-new", b"fast", b"far"))
    peers = [_peer("QmSlow", [(80, slow_old, 3), (81, slow_new, 3)], round_=82),
             _peer("QmFast", [(130, fast, 3)], round_=131), _peer("QmFar", [(10, far, 3)], round_=11)]
    body = {slow_old: b"old", slow_new: b"new", fast: b"fast", far: b"far"}
    fetched = []

    async def fetch(peer, digest, timeout, size):
        fetched.append(digest)
        return body[digest], "ok"

    async def main():
        window = dict(wanted=lambda r: 99 <= r <= 103, oldest=99, newest=103)
        limits = dataclasses.replace(LIMITS, max_lag=40)
        state = Delivery()
        t0 = time.monotonic()
        got = await collect_offers(_lister(peers), fetch, limits, state, min_count=2, deadline_s=3, **window)
        assert sorted(g.digest for g in got.packets) == sorted([slow_new, fast]) and time.monotonic() - t0 < 1.0
        assert sorted(fetched) == sorted([slow_new, fast]) and got.dropped["stale"] == 2  # slow_old and far
        state.forget_before(200)  # the digests are forgotten, the (peer, round) it came for is not
        got = await collect_offers(_lister(peers), fetch, limits, state, min_count=1, deadline_s=0.3, **window)
        assert got.packets == [] and sorted(fetched) == sorted([slow_new, fast])
        no_lag = await collect_offers(_lister(peers), fetch, LIMITS, Delivery(), min_count=1, deadline_s=0.3, **window)
        assert no_lag.packets == []  # max_lag 0: the window only, as before

    asyncio.run(main())


def test_a_lagging_peers_newest_offer_is_delivered_though_it_offers_a_newer_one_meanwhile():
    """A peer 3 rounds ahead on 200-ms links: its newest offer is fetched, and by the time the bytes
    arrive it offers a newer round. The fetch was wanted when it began, so it is delivered (within
    max_lag), not dropped as stale; the chaos soak's n0 lost every packet of such a peer this way."""
    import dataclasses

    first, second = packet_digest(b"r104"), packet_digest(b"r105")
    listings = [[_peer("QmAhead", [(104, first, 4)], round_=104)],
                [_peer("QmAhead", [(104, first, 4), (105, second, 4)], round_=105)]]

    async def list_peers(timeout):
        return listings[0] if len(listings) == 1 else listings.pop(0)

    async def fetch(peer, digest, timeout, size):
        await asyncio.sleep(0.3)  # the listing moves on meanwhile
        return {first: b"r104", second: b"r105"}[digest], "ok"

    async def main():
        limits = dataclasses.replace(LIMITS, max_lag=40)
        got = await collect_offers(list_peers, fetch, limits, Delivery(), min_count=2, deadline_s=2.0,
                                   wanted=lambda r: 99 <= r <= 103, oldest=99, newest=103)
        assert [g.digest for g in got.packets] == [first, second] and not got.dropped.get("stale")

    asyncio.run(main())

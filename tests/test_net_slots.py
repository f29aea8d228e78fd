"""SlotMemory (net/slots.py): the bench, the idle clocks of empty neighbours that left, and the slots held for
their groups, on their own (the mesh-level attacks that shaped them are in test_net_scores.py)."""

from swarm_node.net.slots import (EMPTY_MEMORY_S, IDLE_BENCH_S, MAX_HOLDS, MAX_IDLE_BENCH_S, MAX_REMEMBERED,
                                  SILENT_BENCH_S, STARVING_BENCH_S, SlotMemory)


def test_an_eviction_benches_for_longer_each_time_and_holds_the_slot_for_its_group_as_long():
    slots = SlotMemory()
    ends = [slots.evicted("QmIdle", "10.1.2.0/24", now=t, silent=False, starving=False) for t in (0.0, 1000.0, 5000.0)]
    assert ends == [IDLE_BENCH_S, 1000.0 + 2 * IDLE_BENCH_S, 5000.0 + 4 * IDLE_BENCH_S]
    assert slots.is_benched("QmIdle", ends[-1] - 1) and not slots.is_benched("QmIdle", ends[-1])
    assert slots.vacated["QmIdle"] == ("10.1.2.0/24", ends[-1])
    # one that delivered, then fell silent: a short bench; a starving node's eviction: briefest, and not counted
    assert slots.evicted("QmCut", None, now=0.0, silent=True, starving=False) == SILENT_BENCH_S
    assert slots.evicted("QmCut", None, now=100.0, silent=True, starving=True) == 100.0 + STARVING_BENCH_S
    assert slots.evictions["QmCut"] == 1 and "QmCut" not in slots.vacated  # no group, no hold
    assert max(slots.evicted("QmIdle", None, float(t), False, False) - t for t in range(10_000, 20_000, 1000)) \
        == MAX_IDLE_BENCH_S


def test_a_bench_or_hold_is_never_shortened():
    slots = SlotMemory()
    slots.bench("QmGray", "10.0.0.0/24", until=500.0, now=0.0)
    slots.bench("QmGray", "10.0.0.0/24", until=100.0, now=1.0)
    assert slots.benched["QmGray"] == 500.0 and slots.vacated["QmGray"] == ("10.0.0.0/24", 500.0)


def test_an_empty_neighbour_back_soon_keeps_its_idle_clock_and_its_own_hold_ends():
    slots = SlotMemory()
    slots.left_empty("QmEmpty", (3, 30.0), "10.9.9.0/24", now=50.0)
    assert slots.vacated["QmEmpty"] == ("10.9.9.0/24", 50.0 + EMPTY_MEMORY_S)
    assert slots.returning("QmEmpty", now=50.0 + EMPTY_MEMORY_S - 1) == (3, 30.0)
    assert "QmEmpty" not in slots.vacated and "QmEmpty" not in slots.left
    slots.left_empty("QmEmpty", (3, 30.0), "10.9.9.0/24", now=100.0)
    assert slots.returning("QmEmpty", now=100.0 + EMPTY_MEMORY_S) is None  # too late: a fresh clock
    assert slots.returning("QmNever", now=0.0) is None


def test_every_table_stays_bounded_under_fresh_ids():
    slots = SlotMemory()
    for i in range(4 * MAX_HOLDS):  # fresh ids of fresh groups, each benched, each leaving empty, one a second
        slots.bench(f"QmB{i}", f"10.{i // 256}.{i % 256}.0/24", until=i + 30.0, now=float(i))
        slots.evicted(f"QmE{i}", f"11.{i // 256}.{i % 256}.0/24", now=float(i), silent=False, starving=False)
        slots.left_empty(f"QmL{i}", (0, 0.0), f"12.{i // 256}.{i % 256}.0/24", now=float(i))
    assert len(slots.vacated) <= MAX_HOLDS and len(slots.left) <= MAX_REMEMBERED
    assert len(slots.benched) <= MAX_REMEMBERED + 2 and len(slots.evictions) <= 4 * MAX_REMEMBERED + 1
    newest = 4 * MAX_HOLDS - 1  # the newest holds are the ones kept
    assert f"QmL{newest}" in slots.vacated and f"QmL{newest}" in slots.left

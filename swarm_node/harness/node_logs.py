"""What the nodes' logs say they did to each other: the honest peers they graylisted or evicted
(bench/chaos.py reports it; issue 27 asks for none)."""
from __future__ import annotations

import time

FAULT_GRACE_S = 30.0  # after a fault ends, evictions of and by its node are still its doing (idle rounds, restart)


def honest_peers_lost(nodes: list, events: list[dict]) -> dict:
    """Which honest nodes' peer ids a node's log says it graylisted or evicted ("N idle neighbor(s) lost
    their slot: ids", "peer X opened streams over its rate"), and the evictions no fault explains: a fault
    excuses evictions of and by its node from its start to FAULT_GRACE_S after it ended (a killed,
    frozen or cut node delivers nothing, and on its return finds its neighbours idle), and a node's
    run ending ("... before leaving", its last round done) excuses every later eviction of and by it:
    it left (in a CI run, n1 still in its last rounds evicted n0 3 s after n0 had finished)."""
    owner = {pid: n.name for n in nodes for life in n.lives if (pid := life.get("peer_id"))}
    windows = [(e["node"], e["t"], e.get("t_end", e["t"]) + FAULT_GRACE_S) for e in events]
    evicted, outside, graylisted = [], [], []
    start = min((e["t"] for e in events), default=time.time())
    day = time.strftime("%Y-%m-%d", time.localtime(start))
    logs = {n.name: (n.out / "node.log").read_text(errors="replace").splitlines() for n in nodes}
    for name, lines in logs.items():
        left = [t for line in lines if "before leaving" in line and (t := _when(line, day, start)) is not None]
        if left:
            windows.append((name, left[-1], float("inf")))
    for n in nodes:
        for line in logs[n.name]:
            if "lost their slot: " in line:
                ids, kind = line.split("lost their slot: ", 1)[1].split(", "), evicted
            elif "opened streams over its rate" in line:
                ids, kind = [line.split("peer ", 1)[1].split()[0]], graylisted
            else:
                continue
            t = _when(line, day, start)
            if t is None:
                continue
            for pid in (i.strip() for i in ids):
                if pid not in owner:
                    continue  # the adversary, or a peer we do not know
                kind.append((n.name, owner[pid], line[:8]))
                if kind is evicted and not any(lo <= t <= hi and node in (n.name, owner[pid])
                                               for node, lo, hi in windows):
                    outside.append(kind[-1])
    return {"evicted": evicted, "evicted_outside_faults": outside, "graylisted": graylisted}


def _when(line: str, day: str, start: float) -> float | None:
    """The time of a log line (HH:MM:SS, local time) on the run's clock: `day`, the day the run started
    at `start`, or the next one past midnight (a run is far shorter than 12 h); None if it has no time."""
    try:
        t = time.mktime(time.strptime(f"{day} {line[:8]}", "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    return t + 86400 * (t < start - 43200)

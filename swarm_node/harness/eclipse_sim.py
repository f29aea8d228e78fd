"""Issue 27's eclipse by many Sybil ids, simulated in-process: victim V (a real `Mesh`) against n Sybil
ids and one honest producer H, stepped every 50 ms through the driver's tick (expire, prune, evict,
rescue, candidates when short). Written by an independent red team (session 13) to try the
"producers first while starving" rules (docs/RELIABILITY.md) faster than real processes can: 600 s of
a 256-id attack is ~2 s of CPU. It models what the real benches show (bench/redteam_eclipse.py), not
the transport: knocks that are read, fetches that unmask a liar after 1 s, replies that come at once.
Since session 14 a starving V also fetches from knockers in turn (`Mesh.trials`, knockers.py): H's
packet fetched that way arrives 0.2 s after its turn starts.

Sybil kinds (what a Sybil announces, and what V's fetch of it does):
  empty      no offers
  notfound   a made-up digest of V's round; its fetch comes back not_found ~1 s after V lists it
             (`Mesh.fetched`): the real bench's `liar`
  busy       a made-up digest; every fetch answered `busy` at once: never unmasked as a liar
  stall      a made-up digest; every fetch stalls until it times out (`Knockers.timeout`)
  owndigest  V's own newest offer, copied from V's pushes: V never fetches it

Sybil replies to V's dials (rescue, candidates): "ok" (admitted as outbound) or "stall" (the dial
fails after 5 s; the id stays free to knock). Attacker timing: knocks at `knocks_per_s` (<= the 20/s
newcomer budget) and, adaptive, 3 just before each of V's ticks and 8 right after V's round changes.
H (V is its configured peer) knocks after `full` on its backoff 10, 20, 40 ... 120 s, with jitter; V's
dial to H is answered ok at once. V's round ends 1 s after it starts with H a neighbour (H delivered,
credited), else at the 20-s deadline.

bench/eclipse_sim.py runs the campaign; tests/test_net_scores.py one short trial of the worst kind.
"""
from __future__ import annotations

import random

from swarm_node.net.announce import Mesh
from swarm_node.net.scores import MeshParams

ADDR = ["/ip4/127.0.0.1/tcp/1"]
DT = 0.05
B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
H_OFFER = "sha256:" + "b" * 64
KINDS = ("empty", "notfound", "busy", "stall", "owndigest")


def ann(rnd, offers, peers=()):
    return {"run_id": "r", "seq": int(rnd * 1000) + 1, "degree": 0, "model_id": "m", "tokenizer": "t", "protocol": 1,
            "round": rnd, "policy_version": 1, "offers": [list(o) for o in offers], "addrs": ADDR,
            "peers": [[p, ADDR] for p in peers]}


def run(kind, sybil_reply="ok", n_sybils=256, knocks_per_s=10.0, seconds=600.0, h_start=60.0, seed=0,
        adaptive=True, tick_phase=None, verbose=False):
    rng = random.Random(seed)
    params = MeshParams.for_peers(2, ttl_s=600.0, max_packet_bytes=10_000)  # D=7, D+2=9, out_quota=2
    v = Mesh("QmV", "r", 1, params, initial={}, rng=random.Random(seed))
    v.measuring = True
    sybils = [f"QmSyb{B58[i // 58]}{B58[i % 58]}" for i in range(n_sybils)]
    t, rnd, round_start = 0.0, 0, 0.0
    own = (0, "sha256:" + "0" * 64, 100)
    v.set_own("m", "t", 0, 1, [own], ADDR)
    admitted_at, unmasked, in_flight, fetching = {}, set(), {}, {}  # fetching: knocker -> (due, outcome)
    h_fetched_at = None  # when H's packet of this round arrived through a knocker's turn
    h_next, h_fulls, h_rounds = h_start + rng.uniform(0, 1), 0, []
    st = {"max_nb": 0, "sybil_dials": 0, "ki": 0}
    next_tick = tick_phase if tick_phase is not None else rng.uniform(0, 1)

    def sybil_offers():
        return [] if kind == "empty" else [own] if kind == "owndigest" else [(rnd, "sha256:" + "f" * 64, 100)]

    def sybil_knock():
        for _ in range(n_sybils):
            s = sybils[st["ki"] % n_sybils]
            st["ki"] += 1
            if s not in v.neighbors and s not in in_flight and not v.slots.is_benched(s, t):
                break  # the attacker knows which of its ids V benched or is dialling
        v.receive(s, ann(rnd, sybil_offers(), rng.sample(sybils, 8)), t)
        if s in v.neighbors:
            admitted_at.setdefault(s, t)

    def dial(p):
        st["sybil_dials"] += p != "QmH"
        in_flight[p] = t + (5.0 if p != "QmH" and sybil_reply == "stall" else 0.0)

    def answers():
        for p, due in list(in_flight.items()):
            if due > t:
                continue
            del in_flight[p]
            if p == "QmH":
                v.on_reply(p, {"status": "ok", **ann(rnd, [(rnd, H_OFFER, 100)])}, t)
            elif sybil_reply == "stall":
                v.on_failure(p, t)
            else:
                v.on_reply(p, {"status": "ok", **ann(rnd, sybil_offers(), rng.sample(sybils, 8))}, t)
            if p in v.neighbors:
                admitted_at.setdefault(p, t)

    acc = 0.0
    while t < seconds:
        answers()
        acc += knocks_per_s * DT
        while acc >= 1:
            acc -= 1
            sybil_knock()
        if t >= h_next and "QmH" not in v.neighbors:
            rep = v.receive("QmH", ann(rnd, [(rnd, H_OFFER, 100)]), t)
            if verbose:
                print(f"t={t:.2f} round {rnd}: H knocks -> {rep['status']}")
            if rep["status"] == "ok":
                admitted_at["QmH"] = t
            else:
                h_fulls += 1
                h_next = t + min(120.0, 10.0 * 2 ** (h_fulls - 1)) + rng.uniform(0, 1)
        for p in list(v.neighbors):  # collect: a `notfound` liar is unmasked 1 s after it is listed
            admitted_at.setdefault(p, t)
            if kind == "notfound" and p != "QmH" and p not in unmasked and t - admitted_at[p] >= 1.0:
                v.fetched(p, "not_found")
                unmasked.add(p)
        for p in [p for p in admitted_at if p not in v.neighbors]:
            admitted_at.pop(p)
            unmasked.discard(p)
        for info in v.trials(t):  # collect: starving, the knockers on trial are fetched from
            p = info.peer_id
            if p not in fetching:
                fetching[p] = (t + 0.2, "ok") if p == "QmH" else (t + 1.0, "not_found") if kind == "notfound" else (
                    t + 0.1, "busy") if kind == "busy" else (t + v.knockers.timeout(p, 10.0), "timeout")
        for p, (due, outcome) in list(fetching.items()):
            if due <= t:
                del fetching[p]
                v.fetched(p, outcome)
                if outcome == "ok" and h_fetched_at is None:
                    h_fetched_at = t
        h_in = ("QmH" in v.neighbors and t - max(admitted_at.get("QmH", t), round_start) >= 1.0) or (
            h_fetched_at is not None and t - h_fetched_at >= 1.0)
        if h_in or t - round_start >= 20.0:
            if h_in:
                v.credit("QmH", t)  # a neighbour's slot earned, or a knocker proven
            h_fetched_at = None
            h_rounds.append(h_in)
            rnd += 1
            own = (rnd, "sha256:" + f"{rnd % 16:x}" * 64, 100)
            v.set_own("m", "t", rnd, 1, [own], ADDR)
            round_start = t
            if adaptive:
                for _ in range(8):
                    sybil_knock()
        if t + DT > next_tick:  # the driver's tick
            if adaptive:
                for _ in range(3):
                    sybil_knock()
            next_tick += 1.0
            v.expire(t)
            v.prune(t)
            v.evict(t)
            for p, _ in v.rescue(t, busy=set(in_flight)):
                if verbose and p == "QmH":
                    print(f"t={t:.2f} rescue dials H")
                dial(p)
            answers()
            if v.short():
                need = v.dials_wanted() - sum(p not in v.neighbors for p in in_flight)
                for p, _ in (v.candidates(need, t, busy=set(in_flight)) if need > 0 else []):
                    dial(p)
                answers()
        st["max_nb"] = max(st["max_nb"], len(v.neighbors))
        t += DT
    return {"kind": kind, "reply": sybil_reply, "rounds": len(h_rounds), "rounds_with_H": sum(h_rounds),
            "max_neighbours": st["max_nb"], "max_degree": params.max_degree, "sybil_dials": st["sybil_dials"]}


def campaign(kind, reply, trials=10, **kw):
    res = [run(kind, reply, seed=s, **kw) for s in range(trials)]
    return {"kind": kind, "reply": reply, "trials": trials,
            "trials_H_never_in": sum(r["rounds_with_H"] == 0 for r in res),
            "frac_rounds_with_H": round(sum(r["rounds_with_H"] for r in res) / sum(r["rounds"] for r in res), 3),
            "max_neighbours": max(r["max_neighbours"] for r in res), "sybil_dials_per_trial":
                sum(r["sybil_dials"] for r in res) // trials}

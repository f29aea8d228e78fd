"""A peer's packets may teach a node, never un-teach it (loss.teach_only, loss.implausible), as real
processes on 127.0.0.1.

Victim V and honest peer H are `swarm-node join` nodes at the project's defaults for `tiny-s`
(16 prompts a round, lr 1e-4, G = 12) from the demo's 800-step warm start, 100 rounds. The
attacker (swarm_node/harness/poisoner.py --kind junk, issue 26) serves V packets that pass every
admission check: real train prompts, exactly G completions, none too long, log-probs of the public
warm start. Per group, 6 correct completions with junk and a newline before the answer line
(reward 1) and 6 wrong ones that are the right answer line followed by junk (reward 0); it offers
rounds ahead, so V trains on its groups in almost every round. Measured here: with the paper's
F-TIS for every peer V fell from 0.14 to 0.01 held-out pass@1; with its negatives dropped alone
to 0.03 (the positives un-teach too: V learns a context in which it never learned the answer);
with negatives and implausible positives dropped it rose to 0.485 (0.45 with fair arrival too;
these runs predate the anchored, per-token bar, whose own re-run is in docs/RELIABILITY.md).

With the defences on, every positive the attacker sends is dropped as implausible, so it earns no
mesh credit and V evicts it as an idle neighbour within a few rounds (swarm/exchange.py `credit`);
with the paper's objective nothing is dropped and it keeps its slot for all 100 rounds.
"""

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from swarm_node.harness.poisoner import VICTIM_WARMSTART_STEPS, victim_args
from swarm_node.harness.process import NodeProcess
from swarm_node.harness.warmstart import public_warm_start

pytestmark = pytest.mark.slow

ROUNDS = 100
# The arms run: peer_negative_weight with peer_plausibility_margin at its default (1.0), or "paper" (the
# paper's F-TIS for every peer: weight 1, no plausibility check). CI runs the default arm only; its
# figures for "paper" are in docs/RELIABILITY.md. SWARM_NODE_POISON_ARMS=paper,0 runs both.
ARMS = os.environ.get("SWARM_NODE_POISON_ARMS", "0").split(",")
NODE = victim_args(ROUNDS)


def attacked_swarm(tmp: Path, procs, arm: str) -> tuple[list[dict], list[dict]]:
    """(V's rows, H's rows) of one run with the attacker serving V, in `arm` (see ARMS)."""
    run, model = f"poison-{arm}", public_warm_start(VICTIM_WARMSTART_STEPS)  # cached first: the nodes reuse it
    loss = (["--set", "loss.peer_negative_weight=1", "--set", "loss.peer_plausibility_margin=null",
             "--set", "loss.peer_max_advantage=null"] if arm == "paper"
            else ["--set", f"loss.peer_negative_weight={arm}"]) + ["--run-id", run]
    v = procs(NodeProcess.join([*NODE, *loss, "--set", "train.seed=0"], tmp / "victim"))
    h = procs(NodeProcess.join([*NODE, *loss, "--set", "train.seed=1", "--peers", v.address()], tmp / "honest"))
    evil = procs(NodeProcess([sys.executable, "-m", "swarm_node.harness.poisoner", "--kind", "junk",
                              "--peers", v.address(), "--run-id", run, "--model", model,
                              "--groups", "16", "--seconds", "900", "--summary", str(tmp / "attacker.json")]))
    attacker = evil.wait_line("ATTACKER", 180).split()[1]
    for node in (v, h):
        assert node.wait(900) == 0, node.text()
    evil.popen.terminate()
    assert evil.wait(60) == 0, evil.text()
    offered = json.loads((tmp / "attacker.json").read_text())["rounds"]
    evicted = [line for line in v.lines if "lost their slot" in line and attacker in line]
    if arm == "paper":  # nothing of it is dropped: it keeps its slot and attacks every round
        assert len(offered) >= ROUNDS, evil.text()
    else:  # every positive of it is implausible: no credit, so V evicts it (it offered until then)
        assert evicted and len(offered) >= 5, (evil.text(), evicted)
    return v.rows(), h.rows()


def test_a_junk_poisoner_cannot_unteach_a_node(tmp_path, procs):
    for arm in ARMS:
        v_rows, h_rows = attacked_swarm(tmp_path / arm, procs, arm)
        start, end = v_rows[0]["eval/accuracy"], v_rows[-1]["eval/accuracy"]
        peer_groups = sum(r.get("swarm/peer_groups_used", 0) for r in v_rows[1:])
        dropped = [np.mean([r.get(k, 0.0) for r in v_rows[1:]]) for k in ("train/peer_negatives_frac",
                                                                         "train/peer_implausible_frac")]
        print(f"\narm {arm}: victim pass@1 {start:.3f} -> {end:.3f} after {ROUNDS} rounds, honest peer "
              f"{h_rows[0]['eval/accuracy']:.3f} -> {h_rows[-1]['eval/accuracy']:.3f}; victim trained on {peer_groups} "
              f"peer groups; of its sequences {dropped[0]:.2f} were peer negatives, {dropped[1]:.2f} implausible "
              f"peer positives")
        assert [r["round"] for r in v_rows] == list(range(ROUNDS + 1))
        assert peer_groups >= ROUNDS  # peers' groups were trained on in (about) every round
        if arm == "paper":  # the attack is real: with the paper's objective it un-teaches the victim
            assert end < start - 0.06, (start, end)
        else:
            # held-out pass@1 on n = 200 has a standard error of ~0.03; the paper arm ended at 0.01
            assert end >= start - 0.03, (start, end)


def test_sybils_whose_poison_passes_the_objective_are_undone_by_the_guard(tmp_path, procs):
    """The guard (train/guard.py) is the defence for harm that passes every other one: an attack
    nobody has thought of yet. Here that harm is made certain by giving V the paper's objective for
    every peer (negatives weighted, no plausibility bar, no advantage cap), so the `junk` packets
    of 6 Sybil ids of one process, which join V before the honest peer, reach V's gradient: with that
    objective one such id took V from 0.14 to 0.01 in 100 rounds (docs/RELIABILITY.md). The guard
    must find that V fell behind its copy trained on its own groups, put V back on that copy and
    lock the ids out, so V ends where it would have alone, not at 0.

    (Until session 29 this test ran `skew` Sybils against the default objective. Their harm did not
    always reach the guard's bar in 60 rounds, so the test could not require a reset.)"""
    rounds, run, model = 60, "guard-junk", public_warm_start(VICTIM_WARMSTART_STEPS)
    paper = ["--set", "loss.peer_negative_weight=1", "--set", "loss.peer_plausibility_margin=null",
             "--set", "loss.peer_max_advantage=null"]
    v = procs(NodeProcess.join([*victim_args(rounds), *paper, "--run-id", run, "--set", "train.seed=0"],
                               tmp_path / "victim"))
    evil = procs(NodeProcess([sys.executable, "-m", "swarm_node.harness.poisoner", "--kind", "junk", "--ids", "6",
                              "--peers", v.address(), "--run-id", run, "--model", model, "--groups", "16",
                              "--seconds", "900"]))
    evil.wait_line("ATTACKER", 300)
    time.sleep(5)  # they take V's slots first
    h = procs(NodeProcess.join([*victim_args(rounds), "--run-id", run, "--set", "train.seed=1",
                                "--peers", v.address()], tmp_path / "honest"))
    for node in (v, h):
        assert node.wait(900) == 0, node.text()
    evil.popen.terminate()
    rows = v.rows()
    checks = [(r["round"], round(r["guard/gap"], 3), round(r["guard/bar"], 3)) for r in rows if "guard/gap" in r]
    resets = max(r.get("guard/resets", 0) for r in rows)
    # the lockdown each harm starts (its rounds left at the check), counted at the harm: one found at round 55
    # locks until 75, past the end
    locked = max((r.get("guard/lockdown_rounds", 0) for r in rows if "guard/gap" in r), default=0)
    start, end = rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]
    attacked = sum(r.get("swarm/peer_groups_used", 0) for r in rows[1:])
    print(f"\nguard against 6 junk Sybils under the paper's objective: V {start:.3f} -> {end:.3f}, {attacked} peer "
          f"groups trained on, {resets} reset(s), {locked} rounds in a lockdown; checks (round, pooled gap, bar): "
          f"{checks}")
    assert attacked >= 20, attacked  # the poison reached V's steps
    # the guard found the harm, put V back and locked the ids out (the default guard_ban_rounds = 20)
    assert resets >= 1 and locked >= 20, checks
    # V learns on as its own copy would (measured: 0.205 -> 0.24 and 0.34 in 60 rounds); n = 200 has a
    # standard error of ~0.03. With this objective and no guard V falls towards 0.
    assert end >= start - 0.03, (start, end, checks)

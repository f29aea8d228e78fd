"""Driving nodes from outside: what the demo, the tests and the benchmarks share.

    process.py      NodeProcess: a `swarm-node` node (or helper program) in its own process group with
                    its log; waits on its status.json, reads its metrics rows; the ordered stop
                    (SIGINT, then SIGTERM and SIGKILL to the group, then any descendant left)
    signals.py      SIGINT/SIGTERM of a program that runs nodes (the demo): no child left untracked
    warmstart.py    the public warm start of a tiny recipe; the demo's parallel warm starts with progress bars
    learning.py     the learning check's recipe and summary (tests/test_learning.py, bench/learning_spread.py)
    netns.py        a small internet in Linux network namespaces (NAT, loss, rate, partitions) for
                    tests and benchmarks that cross real networks; netem.py: its userspace link delay
    hostile.py      what a hostile peer is made of: a transport serving lying offers, the public model,
                    following the honest rounds; two programs use it:
    adversary.py    `python -m swarm_node.harness.adversary`: malformed, forged, flooding, stalling,
                    echoing peers (tests/test_reliability.py, bench/chaos.py)
    poisoner.py     `python -m swarm_node.harness.poisoner`: packets that pass every check and un-teach
                    (tests/test_poisoning.py, bench/poisoning.py, bench/redteam_*.py);
    poison_kinds.py the groups of its red-team matrix kinds (bench/redteam_matrix.py)
    sybils.py       `python -m swarm_node.harness.sybils`: k live Sybil ids in one process (bench/redteam_eclipse.py)
    eclipse_sim.py  the same eclipse with hundreds of ids against a real `Mesh`, time-stepped in-process
    handshake_flood.py  `python -m swarm_node.harness.handshake_flood`: half Noise or TLS handshakes that make a
                    node's p2pd work for bytes built once (tests/test_net_firewall.py, bench/handshake_cost.py)

Programs here learn about a node only from the files it writes in its --out directory and its
output. This layer sits above node.py and below commands/: it must not import commands/. Nothing
below it imports it: no node ever runs this code.
"""

"""Driving nodes from outside: what the demo, the tests and the benchmarks share.

    process.py      NodeProcess: a `swarm-node` node (or helper program) in its own process group with
                    its log; waits on its status.json, reads its metrics rows; the ordered stop
                    (SIGINT, then SIGTERM and SIGKILL to the group, then any descendant left)
    signals.py      SIGINT/SIGTERM of a program that runs nodes (the demo): no child left untracked
    warmstart.py    the public warm start of a tiny recipe; the demo's parallel warm starts with progress bars
    netns.py        a small internet in Linux network namespaces (NAT, loss, rate, partitions) for
                    tests and benchmarks that cross real networks; netem.py: its userspace link delay

Programs here learn about a node only from the files it writes in its --out directory and its
output. This layer sits above node.py and below commands/: it must not import commands/.
"""

"""The demo and the figures: off the training path (no node module imports this package).

    run.py             `swarm-node demo`: node specs, command lines, one run kind, the whole demo
    processes.py       node processes: start in their own sessions, wait until up, stop in order
    warmstart_pool.py  the nodes' warm starts in worker processes, with progress bars
    live.py            the live table (tails metrics.jsonl and status.json) and summary tables
    plots.py           accuracy.png, training.png, compare.png from any runs' metrics.jsonl

Programs here learn about nodes only from the files a node writes in its --out directory
(metrics.jsonl, status.json, config.yaml), never from its log lines.
"""

from swarm_node.demo.plots import plot_runs
from swarm_node.demo.run import demo_overrides, run_demo

__all__ = ["demo_overrides", "plot_runs", "run_demo"]

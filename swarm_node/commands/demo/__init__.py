"""The demo and the figures: off the training path (no node module imports this package).

    run.py             `swarm-node demo`: node specs, command lines, one run kind, the whole demo
                       (its node processes and warm starts: swarm_node/harness/)
    live.py            the live table (tails metrics.jsonl and status.json) and summary tables
    plots.py           accuracy.png, training.png, compare.png from any runs' metrics.jsonl

Programs here learn about nodes only from the files a node writes in its --out directory
(metrics.jsonl, status.json, config.yaml), never from its log lines.
"""

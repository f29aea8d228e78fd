"""Benchmarks: one script per question, each runnable as `python bench/x.py` or `python -m bench.x`.

Scripts share bench/_common.py (machine info, results files, tables, timing) and drive nodes
through swarm_node.harness, never through tests/ (tests/test_layers.py checks that neither side
imports the other). Results land in bench/results/; docs/BENCHMARKS.md quotes them.
"""

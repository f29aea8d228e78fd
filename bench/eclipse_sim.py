"""Issue 27's eclipse by many Sybil ids, simulated in-process (swarm_node/harness/eclipse_sim.py): every
Sybil kind against both replies to V's dials, `--trials` seeds of 600 s each, 256 ids by default.

    PYTHONPATH=. .venv/bin/python bench/eclipse_sim.py --trials 10 --out bench/results/eclipse_sim.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as `python bench/x.py`: import `swarm_node` from the repository root
    sys.path[0] = str(Path(__file__).resolve().parents[1])
from swarm_node.harness.eclipse_sim import KINDS, campaign  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ids", type=int, default=256, help="Sybil ids")
    ap.add_argument("--out", default=None, help="write the table as JSON here")
    args = ap.parse_args()
    rows = []
    for kind in KINDS:
        for reply in ("ok", "stall"):
            rows.append(campaign(kind, reply, args.trials, n_sybils=args.ids))
            print(rows[-1], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"ids": args.ids, "trials": args.trials, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

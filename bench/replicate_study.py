"""The design of bench/replicate.py's study (F-TIS, arXiv 2605.22537, in miniature): node recipes,
pairs, arms, the run plan at full and quick scale, and where results and the report go.

bench/replicate.py runs it; bench/replicate_report.py turns its results into docs/REPLICATION.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results" / "replication"
RUNS = REPO / "runs" / "replicate"
DOC, IMG = REPO / "docs" / "REPLICATION.md", REPO / "docs" / "img"

TASK = {"digits": 2, "second_digits": 1}  # the demo's task: "What is 48 plus 7?"
OOD = {"digits": 2, "second_digits": 2}  # with a second operand of 10..99: never seen in training
WARM_STEPS, MAX_NEW_TOKENS = 800, 10


@dataclass(frozen=True)
class Node:
    """One node recipe: model, trainable parameters, learning rate, warm-start slice of the task."""

    name: str
    model: str
    lr: float
    index: int  # part of the node's RL seed, so two nodes of a swarm answer different prompts
    lora_r: int = 0
    warm_ops: tuple[str, ...] = ("plus", "minus")


NODES = {n.name: n for n in [
    Node("tiny-s", "tiny-s", 1e-5, 1),
    Node("tiny-m", "tiny-m", 2e-5, 2),
    Node("tiny-s-lora", "tiny-s", 5e-4, 3, lora_r=8),
    Node("tiny-s-plus", "tiny-s", 1e-5, 4, warm_ops=("plus",)),
    Node("tiny-s-minus", "tiny-s", 1e-5, 5, warm_ops=("minus",)),
]}
PAIRS = {"size": ("tiny-s", "tiny-m"), "trainable": ("tiny-s", "tiny-s-lora"),
         "expertise": ("tiny-s-plus", "tiny-s-minus")}
# the real-model study's pairs (bench/replicate_real.py): SmolLM2-135M-Instruct fully fine-tuned + the
# same with LoRA r = 128 on q/v (the paper's trainable pair); two full fine-tunes warm-started on
# addition only and on subtraction only (an expertise pair). Each pair's runs: one JSON per (arm, seed)
REAL_PAIRS = {"smollm2": ("full", "lora"), "smollm2-expertise": ("plus", "minus")}
REAL_FOLDERS = {"smollm2": RESULTS / "real", "smollm2-expertise": RESULTS / "real-expertise"}
REAL_WARM_STEPS = 100  # the expertise pair's supervised steps on its one operation, before RL on both
REAL_ROUNDS = 50  # the paper's 50 iterations: a real-model run counts for a verdict once both nodes reach it
G = 12  # the paper's group size
# the paper's horizontal with two nodes: both answer the same 2 prompts, each generating half of every
# group, so a merged group holds G and a step the same 24 sequences as vertical (1 own + 1 peer group)
PAPER_HORIZONTAL = {"rollout.group_size": G // 2, "rollout.prompts_per_round": 2}
# arm -> (loss variant, swarm mode or None for alone, filter threshold g)
ARMS = {"alone": ("nois", None, 50.0), "nois": ("nois", "vertical", 50.0), "f-nois": ("f-nois", "vertical", 50.0),
        "f-tis": ("f-tis", "vertical", 50.0), "f-vis": ("f-vis", "vertical", 50.0),
        "horizontal": ("f-tis", "horizontal", 50.0), "g5": ("f-tis", "vertical", 5.0),
        "g10": ("f-tis", "vertical", 10.0), "g100": ("f-tis", "vertical", 100.0),
        # F-TIS with the open-swarm defaults instead of the paper's weights (issue 26: does collaboration
        # survive the poisoning defences?)
        "f-tis-open": ("f-tis", "vertical", 50.0)}
OPEN_ARM = "f-tis-open"
# (pair, arm) in the order they run: the core claims first, over every seed, so a cut-off study
# still answers them
PLAN = ([("size", a) for a in ("alone", "nois", "f-tis", "f-nois", "f-vis", "horizontal", "g5", "g10", "g100")]
        + [(p, a) for p in ("trainable", "expertise") for a in ("alone", "nois", "f-nois", "f-tis")]
        + [(p, OPEN_ARM) for p in ("size", "trainable", "expertise")])


@dataclass(frozen=True)
class Scale:
    """How much of the plan runs: rounds, evaluation sizes, seeds, (pair, arm)s, where results go."""

    rounds: int
    eval_every: int
    eval_limit: int
    ood_limit: int
    seeds: tuple[int, ...]
    plan: tuple[tuple[str, str], ...]
    results: Path


FULL = Scale(rounds=100, eval_every=25, eval_limit=500, ood_limit=500, seeds=(0, 1, 2), plan=tuple(PLAN),
             results=RESULTS)
QUICK = Scale(rounds=4, eval_every=0, eval_limit=100, ood_limit=100, seeds=(0,),
              plan=(("size", "alone"), ("size", "nois"), ("size", "f-tis")), results=RUNS / "quick")

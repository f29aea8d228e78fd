"""warmstart.py: the cached supervised warm start, and two processes racing to create it."""

import json
import threading

from swarm_node.config import ModelConfig, load_config
from swarm_node.tasks import load_task
from swarm_node.train import warmstart
from swarm_node.train.policy import Policy


def test_two_warm_starts_of_one_recipe_at_once_both_get_the_complete_model(monkeypatch):
    """Two nodes that share a cache and a pid (containers on one cache volume, here two threads)
    create the same warm start at once: each writes its own temporary directory, one is renamed into
    place, and both get a complete, loadable model. (With a per-pid temporary name, the second
    writer deleted the first one's files half-way: a compose node exited early, 1 run in 7.)"""
    cfg = load_config(None, ["model.name=tiny-s", "train.warmstart_steps=2", "threads=1"])
    task, real_save, targets = load_task("arith"), Policy.save, []
    Policy.load(ModelConfig(name="tiny-s"))  # transformers' lazy imports are not thread-safe: done once here
    both_saving = threading.Barrier(2, timeout=60)

    def save_side_by_side(policy, path):
        targets.append(str(path))
        both_saving.wait()  # neither finishes before the other has started
        real_save(policy, path)

    monkeypatch.setattr(Policy, "save", save_side_by_side)
    results, errors = [], []

    def start():
        try:
            results.append(warmstart.warmstarted_model(cfg, task))
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 2 and results[0] == results[1], (errors, results)
    assert len(set(targets)) == 2, f"both writers used one temporary directory: {targets}"
    path = warmstart.warmstart_path(cfg)
    assert json.loads((path / "recipe.json").read_text())["steps"] == 2
    Policy.load(ModelConfig(name=str(path)))  # complete: it loads
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.tmp-")]  # none left behind

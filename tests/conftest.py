"""Shared fixtures: tiny policies, the arith task, and an isolated warm-start cache."""

import logging
import os
from pathlib import Path

import pytest

# procs: the `procs` fixture, real child processes, cleaned up; ci_skips: under CI a skip is a failure
pytest_plugins = ["procs", "ci_skips"]

DATA = Path(os.environ.get("SWARM_NODE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Warm-started models go to a per-session temp cache, never to the user's ~/.cache."""
    monkeypatch.setenv("SWARM_NODE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(autouse=True)
def _cli_log_handlers_removed():
    """An in-process CLI run (CliRunner) points the root logger at its own stderr, closed when the run
    ends: later tests logged into a closed file ("--- Logging error ---"). The handlers a test added
    (pytest's own capture handlers excepted) are closed and removed when it ends."""
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in before and not type(h).__module__.startswith("_pytest")]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


@pytest.fixture(scope="session")
def arith():
    from swarm_node.tasks import load_task

    return load_task("arith")


@pytest.fixture
def tiny_policy():
    from swarm_node.config import ModelConfig
    from swarm_node.train.policy import Policy

    return Policy.load(ModelConfig(name="tiny-s", init_seed=0))


def pytest_configure(config):
    """One torch thread: tiny models run several times faster that way on a shared 2-core CPU."""
    import torch

    torch.set_num_threads(1)


"""Checkpoints: atomic writes, the previous checkpoint survives a torn write, clear errors."""

import os
from pathlib import Path

import pytest
import torch

from swarm_node.config import ModelConfig, NodeConfig
from swarm_node.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from swarm_node.train.policy import Policy


def _save(tmp_path, policy, round_):
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    torch.manual_seed(round_)
    return save_checkpoint(tmp_path, policy, opt, {"round": round_, "policy_version": round_}, NodeConfig())


def test_save_load_and_keep_two(tmp_path, tiny_policy):
    for r in (1, 2, 3):
        path = _save(tmp_path, tiny_policy, r)
    assert latest_checkpoint(tmp_path) == path and path.name == "round-000003"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("round-*")) == ["round-000002", "round-000003"]
    opt = torch.optim.AdamW(tiny_policy.trainable_parameters(), lr=1e-3)
    torch.manual_seed(99)
    state = load_checkpoint(path, opt)
    assert state == {"round": 3, "policy_version": 3}
    assert torch.equal(torch.get_rng_state(), torch.manual_seed(3).get_state())
    reloaded = Policy.load(ModelConfig(name=str(path / "model")))
    for a, b in zip(tiny_policy.model.parameters(), reloaded.model.parameters()):
        assert torch.equal(a, b)


def test_torn_write_leaves_previous_checkpoint(tmp_path, tiny_policy):
    good = _save(tmp_path, tiny_policy, 1)
    # What a kill -9 in the middle of writing round 2 leaves behind: a temp dir without state.json.
    torn = tmp_path / "checkpoints" / ".tmp-round-000002-999"
    (torn / "model").mkdir(parents=True)
    (torn / "optimizer.pt").write_bytes(b"\x00" * 10)
    assert latest_checkpoint(tmp_path) == good
    # A `latest` pointer naming an incomplete directory falls back to the newest complete one.
    (tmp_path / "checkpoints" / "round-000002").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("round-000002")
    assert latest_checkpoint(tmp_path) == good


def test_no_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path) is None


@pytest.mark.skipif(os.geteuid() == 0, reason="not applicable: root ignores directory permissions")
def test_unwritable_directory_is_a_clear_error(tmp_path, tiny_policy):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(CheckpointError, match="cannot write checkpoint"):
            _save(tmp_path, tiny_policy, 1)
    finally:
        tmp_path.chmod(0o700)


def test_write_failure_is_a_clear_error(tmp_path, tiny_policy):
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    with pytest.raises(CheckpointError, match="cannot write checkpoint"):
        _save(tmp_path, tiny_policy, 1)


def test_torch_save_on_a_full_disk_is_named_as_such(tmp_path, tiny_policy, monkeypatch):
    """torch.save's error on a full disk is "unexpected pos N vs M" (found by bench/chaos.py on a
    16 MiB tmpfs); the message must say the disk is full."""
    import shutil

    from swarm_node.train import checkpoint

    def failing_save(obj, path, *a, **k):
        Path(path).write_bytes(b"x" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 159808 vs 159700")

    monkeypatch.setattr(checkpoint.torch, "save", failing_save)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 20, 10 << 20, 4096))
    with pytest.raises(CheckpointError, match="No space left on device .4096 bytes free.*unexpected pos"):
        _save(tmp_path, tiny_policy, 1)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 0, 5 << 30))
    with pytest.raises(CheckpointError, match="cannot write checkpoint under .*: \\[enforce fail"):  # not a full disk
        _save(tmp_path, tiny_policy, 2)


class _Payload:
    """Unpickling this calls os.system: what a checkpoint copied from someone else could hold."""

    def __reduce__(self):
        return (os.system, (f"touch {_Payload.marker}",))


def test_a_checkpoint_that_would_run_code_when_unpickled_is_refused_unrun(tmp_path, tiny_policy):
    path = _save(tmp_path, tiny_policy, 1)
    _Payload.marker = tmp_path / "ran"
    torch.save({"torch": torch.get_rng_state(), "python": _Payload()}, path / "rng.pt")
    opt = torch.optim.AdamW(tiny_policy.trainable_parameters(), lr=1e-3)
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path, opt)
    assert not _Payload.marker.exists()

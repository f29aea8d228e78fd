"""swarm_node/tracking.py: rows go to metrics.jsonl and to the trackers; the trackers' files are
read back (TensorBoard's EventAccumulator; W&B's offline run file, record by record) and must
hold exactly the numbers of metrics.jsonl, at step = round, plus the run config."""

import json
import logging
import math
import struct
import time

import pytest

from swarm_node import tracking
from swarm_node.errors import SwarmNodeError
from swarm_node.metrics import MetricsWriter, read_metrics
from swarm_node.tracking import open_tracker

CONFIG = {"name": "tiny-s", "train": {"lr": 2e-5, "rounds": 3, "seed": 7}, "swarm": {"peers": ["/ip4/1.2.3.4"]},
          "report_to": ["tensorboard"], "task": {"data": None}}
ROWS = [
    {"round": 0, "node": "tiny-s", "eval/accuracy": 0.125, "eval/n": 40, "time/round_s": 1.5},
    {"round": 1, "node": "tiny-s", "reward/mean": 0.25, "swarm/peers": 2, "swarm/packets_accepted": 3,
     "is/truncated_frac": float("nan"), "loss/value": -0.0312, "flag/ok": True},
    {"round": 2, "node": "tiny-s", "reward/mean": 0.5, "swarm/peers": 1, "time/round_s": 2.25},
    {"round": 2, "node": "tiny-s", "ood/accuracy": 0.75, "ood/n": 10},  # the final OOD row shares the step
]


def write_run(out, report_to, rows=ROWS, first_step=None):
    """What the node does: every row to metrics.jsonl, then to the trackers."""
    tracker = open_tracker(report_to, out, CONFIG, run_name="tiny-s", first_step=first_step)
    metrics = MetricsWriter(out / "metrics.jsonl")
    for row in rows:
        metrics.write(row)
        tracker.log(row, step=row["round"])
    metrics.close()
    tracker.close()
    return read_metrics(out / "metrics.jsonl")


def expected_scalars(rows) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl's numbers per key as (round, value): what every tracker must hold."""
    expected: dict = {}
    for row in rows:
        for key, value in row.items():
            if key != "round" and isinstance(value, (int, float)) and value is not None:
                expected.setdefault(key, []).append((row["round"], float(value)))
    return expected


def tensorboard_scalars(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return events, scalars


def test_no_tracker_writes_nothing(tmp_path):
    assert tracking.check_trackers(["none", "tensorboard", "tensorboard"]) == ["tensorboard"]
    assert tracking.check_trackers(["none"]) == [] and tracking.check_trackers([]) == []
    for report_to in ([], ["none"]):
        tracker = open_tracker(report_to, tmp_path, CONFIG, run_name="x")
        tracker.log(ROWS[0], step=0)
        tracker.close()
    assert list(tmp_path.iterdir()) == []


def test_unknown_tracker_is_a_user_error(tmp_path):
    with pytest.raises(SwarmNodeError, match="unknown tracker.*mlflow"):
        open_tracker(["tensorboard", "mlflow"], tmp_path, CONFIG, run_name="x")
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_events_match_metrics_jsonl(tmp_path):
    pytest.importorskip("tensorboard")
    rows = write_run(tmp_path, ["tensorboard"])
    expected = expected_scalars(rows)
    assert "is/truncated_frac" not in expected  # NaN is null in metrics.jsonl, and absent in TensorBoard
    assert expected["flag/ok"] == [(1, 1.0)] and len(expected["time/round_s"]) == 2

    events, scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert set(scalars) == set(expected)
    for key, points in expected.items():
        got = scalars[key]
        assert [step for step, _ in got] == [step for step, _ in points], key
        for (_, value), (_, want) in zip(got, points, strict=True):
            assert value == pytest.approx(want, rel=1e-6, abs=1e-9), key  # float32 in the event file

    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "lr: 2.0e-05" in text and "seed: 7" in text and "tiny-s" in text
    hparams = events.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hparams)
    assert b"train/lr" in hparams["_hparams_/session_start_info"]


def test_tensorboard_resume_hides_rounds_trained_again(tmp_path, caplog):
    pytest.importorskip("tensorboard")
    write_run(tmp_path, ["tensorboard"], rows=[{"round": r, "reward/mean": r / 10} for r in range(4)])
    again = [{"round": r, "reward/mean": 1 + r / 10} for r in (2, 3, 4)]  # --resume from round 1's checkpoint
    write_run(tmp_path, ["tensorboard"], rows=again, first_step=2)
    with caplog.at_level(logging.ERROR):  # the accumulator reports the purge it does
        _, scalars = tensorboard_scalars(tmp_path / "tensorboard")
    got = [(step, round(value, 5)) for step, value in scalars["reward/mean"]]
    assert got == [(0, 0.0), (1, 0.1), (2, 1.2), (3, 1.3), (4, 1.4)]


def test_tensorboard_missing_says_how_to_install(tmp_path, monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec",
                        lambda name: None if name == "tensorboard" else real(name))
    with pytest.raises(SwarmNodeError, match="pip install tensorboard"):
        open_tracker(["tensorboard"], tmp_path, CONFIG, run_name="x")


def test_wandb_missing_says_how_to_install(tmp_path, monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    with pytest.raises(SwarmNodeError, match="pip install wandb"):
        open_tracker(["wandb"], tmp_path, CONFIG, run_name="x")


def test_a_tracker_that_cannot_write_is_dropped_and_training_goes_on(caplog):
    class Full:
        def log(self, row, step):
            raise OSError(28, "No space left on device")

        def close(self):
            raise AssertionError("a dropped tracker is not closed again")

    class Recorder:
        def __init__(self):
            self.steps, self.closed = [], False

        def log(self, row, step):
            self.steps.append(step)

        def close(self):
            self.closed = True

    recorder = Recorder()
    trackers = tracking.Trackers([Full(), recorder])
    with caplog.at_level(logging.WARNING, logger="swarm_node.tracking"):
        for row in ROWS:
            trackers.log(row, step=row["round"])
    trackers.close()
    assert recorder.steps == [0, 1, 2, 2] and recorder.closed
    assert sum("No space left" in r.getMessage() for r in caplog.records) == 1


def wandb_records(path):
    """The records of a W&B offline run file (LevelDB log format: 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, chunks = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (length == 0 and kind == 0):  # block padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # still being written
            return
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk ends a record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def test_wandb_offline_run_matches_metrics_jsonl(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    rows = write_run(tmp_path, ["wandb"])
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 30  # wandb's service process may still be writing after finish() returns
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(run_file)):
        assert time.monotonic() < deadline, f"{run_file} has no exit record after 30 s"
        time.sleep(0.2)
    got: dict = {}
    config = {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            for key, value in items.items():
                if not key.startswith("_"):
                    got.setdefault(key, []).append((items.get("_step", record.history.step.num), value))
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
    expected = expected_scalars(rows)
    assert set(got) == set(expected)
    for key, points in expected.items():
        steps = sorted({step for step, _ in points})
        assert sorted({step for step, _ in got[key]}) == steps, key
        for step, want in points:
            assert any(s == step and math.isclose(v, want, rel_tol=1e-9) for s, v in got[key]), (key, step)
    assert config["train"]["lr"] == 2e-5 and config["name"] == "tiny-s" and config["swarm"]["peers"] == ["/ip4/1.2.3.4"]

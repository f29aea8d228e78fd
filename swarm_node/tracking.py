"""Experiment trackers: every metrics row also goes to TensorBoard and/or Weights & Biases.

`report_to` follows transformers/TRL: a list of `tensorboard`, `wandb`, `none` (empty or
["none"] = no tracker). `metrics.jsonl` stays the source of truth; a tracker is a copy of it:

    tensorboard   OUT/tensorboard/events.out.tfevents.*: every numeric key of a row as a scalar
                  at step = the row's round, the run config as text (YAML) and as hparams.
                  Offline files; view with `tensorboard --logdir OUT/tensorboard`.
    wandb         `wandb.init(mode="offline", dir=OUT, ...)`: a run under OUT/wandb/ with the
                  config; `wandb sync OUT/wandb/offline-run-*` uploads it later, WANDB_MODE=online
                  logs live, WANDB_PROJECT names the project (default swarm-node).

    check_trackers(cfg.report_to)           # early: unknown name or package missing -> SwarmNodeError
    tracker = open_tracker(cfg.report_to, cfg.out, cfg.to_dict(), run_name=cfg.name)
    tracker.log(row, step=row["round"])     # after metrics.write(row)
    tracker.close()

A tracker that cannot write (disk full) warns once and stops; training goes on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
from pathlib import Path

import yaml

from swarm_node import metrics as M
from swarm_node.errors import SwarmNodeError

log = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "wandb", "none")
STEP_KEY = M.ROUND  # the x axis; not logged as a scalar of its own
HPARAM_METRICS = (M.REWARD_MEAN, M.EVAL_ACCURACY)  # what TensorBoard's HParams table shows per run


def scalars(row: dict) -> dict[str, float]:
    """The row's numeric values (bools as 0/1), without the step key and non-finite numbers."""
    out = {}
    for key, value in row.items():
        if key == STEP_KEY or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue  # metrics.jsonl writes these as null
        out[key] = float(value)
    return out


def flat_hparams(config: dict, prefix: str = "") -> dict[str, float | str | bool]:
    """Nested config -> {"train/lr": 2e-05, "swarm/peers": "[...]", ...} (values TensorBoard accepts)."""
    out: dict = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_hparams(value, prefix=f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif value is not None:
            out[name] = json.dumps(value)
    return out


def check_trackers(report_to: list[str]) -> list[str]:
    """The trackers to open (without "none"); a SwarmNodeError for an unknown name or a missing
    package, cheap enough to call before loading a model."""
    unknown = sorted(set(report_to) - set(TRACKERS))
    if unknown:
        raise SwarmNodeError(f"report_to: unknown tracker(s) {unknown} (valid: {', '.join(TRACKERS)})")
    names = [name for name in dict.fromkeys(report_to) if name != "none"]
    for name in names:
        if importlib.util.find_spec(name) is None:
            raise SwarmNodeError(f"report_to {name} needs the {name} package: pip install {name}")
    return names


class NullTracker:
    """report_to = [] or ["none"]: logs nothing."""

    def log(self, row: dict, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Event files under OUT/tensorboard/ (torch's SummaryWriter; needs the `tensorboard` package)."""

    def __init__(self, out: str | Path, config: dict, run_name: str, first_step: int | None = None):
        check_trackers(["tensorboard"])
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.log_dir = Path(out) / "tensorboard"
        # purge_step: on --resume, events of rounds >= first_step (trained again) are hidden.
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=first_step)
        self.writer.add_text("config", f"run `{run_name}`\n\n```yaml\n{yaml.safe_dump(config, sort_keys=False)}```")
        for summary in hparams(flat_hparams(config), {name: None for name in HPARAM_METRICS}):
            self.writer.file_writer.add_summary(summary)
        self.writer.flush()

    def log(self, row: dict, step: int) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # one flush per round: TensorBoard shows it live, a crash loses nothing

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run, offline unless WANDB_MODE says otherwise (needs the `wandb` package)."""

    def __init__(self, out: str | Path, config: dict, run_name: str):
        check_trackers(["wandb"])
        import wandb

        self.run = wandb.init(mode=os.environ.get("WANDB_MODE", "offline"), dir=str(out), config=config,
                              name=run_name, project=os.environ.get("WANDB_PROJECT", "swarm-node"))

    def log(self, row: dict, step: int) -> None:
        self.run.log(scalars(row), step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """Several trackers behind one `log`/`close`; one that fails to write warns once and is dropped."""

    def __init__(self, trackers: list):
        self.trackers = trackers

    def log(self, row: dict, step: int) -> None:
        for tracker in list(self.trackers):
            try:
                tracker.log(row, step)
            except OSError as e:
                log.warning("%s stopped (metrics.jsonl still has every round): %s", type(tracker).__name__, e)
                self.trackers.remove(tracker)

    def close(self) -> None:
        for tracker in self.trackers:
            try:
                tracker.close()
            except OSError as e:
                log.warning("%s did not close cleanly: %s", type(tracker).__name__, e)
        self.trackers = []


def open_tracker(report_to: list[str], out: str | Path, config: dict, run_name: str,
                 first_step: int | None = None) -> Trackers | NullTracker:
    """The trackers named in `report_to`, writing under `out`. `first_step` (the first round of
    this process, on --resume) makes TensorBoard hide the old events of rounds trained again."""
    names = check_trackers(report_to)
    if not names:
        return NullTracker()
    opened: list = []
    try:
        for name in names:
            if name == "tensorboard":
                opened.append(TensorBoardTracker(out, config, run_name, first_step))
            else:
                opened.append(WandbTracker(out, config, run_name))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    log.info("reporting metrics to %s", ", ".join(names))
    return Trackers(opened)

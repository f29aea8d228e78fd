"""Metrics: one flat dict of namespaced keys per round, appended to `metrics.jsonl`.

Keys follow TRL/cleanrl habits: `reward/mean`, `eval/accuracy`, `is/truncated_frac`,
`filter/dropped_frac`, `swarm/peers`, `time/generate_s`, ... A round's line is written and
flushed as soon as the round ends, so a crash never loses a finished round. A line that cannot
be written (disk full, read-only directory) raises `MetricsError`: the node stops with one clear
error instead of training on without a record. On `--resume`, rows of rounds after the checkpoint
are dropped (`drop_rounds_after`), since those rounds are trained again: no round appears twice.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from swarm_node.errors import SwarmNodeError
from swarm_node.fsutil import write_atomic

log = logging.getLogger(__name__)

# ---- metric keys: written once here, used by the stages that produce them and by readers -------
# (the loss's own keys, `is/*`, `filter/*`, `loss/*`, are `swarm_node.train.loss.STAT_KEYS`)
ROUND, NODE = "round", "node"
REWARD_MEAN, FORMAT_FAIL_FRAC = "reward/mean", "reward/format_fail_frac"
REWARD_ZERO_STD_FRAC = "reward/frac_reward_zero_std"  # share of groups whose rewards are all equal
MEAN_LENGTH, CLIPPED_RATIO = "completions/mean_length", "completions/clipped_ratio"  # clipped: hit max_new_tokens
# the sampler/trainer mismatch on own samples (TRL's names), d = logp - gen_logp per completion token:
MISMATCH_LOGP_DIFF_MEAN = "sampling/sampling_logp_difference/mean"  # mean |d|
MISMATCH_LOGP_DIFF_MAX = "sampling/sampling_logp_difference/max"  # max |d|
MISMATCH_RATIO_MIN, MISMATCH_RATIO_MEAN, MISMATCH_RATIO_MAX = (  # of exp(d)
    "sampling/importance_sampling_ratio/min", "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max")
EVAL_ACCURACY, EVAL_N, OOD_ACCURACY, OOD_N = "eval/accuracy", "eval/n", "ood/accuracy", "ood/n"
TIME_GENERATE, TIME_EXCHANGE, TIME_TRAIN = "time/generate_s", "time/exchange_s", "time/train_s"
TIME_EVAL, TIME_ROUND, TIME_GUARD = "time/eval_s", "time/round_s", "time/guard_s"
# the guard's check (train/guard.py), on its rounds: pass@1 of both models on the private slice, the
# gap (alone only - mixed only) / n and its bar, resets so far; every round: peers not trained on
# now, rounds left of a lockdown (only vouched peers teach)
GUARD_MIXED, GUARD_ALONE, GUARD_GAP, GUARD_BAR = "guard/mixed_accuracy", "guard/alone_accuracy", "guard/gap", "guard/bar"
GUARD_RESETS, GUARD_DISTRUSTED, GUARD_LOCKDOWN = "guard/resets", "guard/distrusted_peers", "guard/lockdown_rounds"
GUARD_VOUCHED = "guard/vouched_peers"
TRAIN_GROUPS, TRAIN_SEQUENCES, TRAIN_ACTIVE_FRAC = "train/groups", "train/sequences", "train/active_frac"
TRAIN_GRAD_NORM, TRAIN_POLICY_VERSION = "train/grad_norm", "train/policy_version"
TRAIN_PEER_NEGATIVES = "train/peer_negatives_frac"  # share of the step's sequences: an untrusted peer's A_i < 0
TRAIN_PEER_IMPLAUSIBLE = "train/peer_implausible_frac"  # share: an untrusted peer's A_i > 0, too unlikely under us or too long
PEERS, PEER_GROUPS_USED = "swarm/peers", "swarm/peer_groups_used"  # peers whose offers the round's collect read
#   (neighbours; while starving also the knockers on trial, so it rises then); groups from peers in the step
PACKETS_RECEIVED, PACKETS_ACCEPTED, PACKETS_REJECTED = (
    "swarm/packets_received", "swarm/packets_accepted", "swarm/packets_rejected")
PACKETS_LAGGING = "swarm/packets_lagging"  # accepted: a slower or faster peer's newest, outside the staleness window
BYTES_IN, BYTES_OUT = "swarm/bytes_in", "swarm/bytes_out"
PACKET_BYTES_IN, PACKET_BYTES_OUT = "swarm/packet_bytes_in", "swarm/packet_bytes_out"
TOKENS_IN, TOKENS_OUT, COMPLETIONS_IN = "swarm/tokens_in", "swarm/tokens_out", "swarm/completions_in"
REWARDS_CORRECTED, FETCH_TIMEOUTS = "swarm/rewards_corrected", "swarm/fetch_timeouts"
FETCH_FAILURES = "swarm/fetch_failures"  # fetches that brought no packet: refused, timed out, broken, not as offered
RETOKENIZED = "swarm/completions_retokenized"  # peer completions whose ids were not our tokenizer's for their text
GROUPS_DUPLICATE = "swarm/groups_duplicate"  # horizontal: peers' shares equal to ours, dropped (swarm/admit.py)
GROUPS_UNSCHEDULED = "swarm/groups_unscheduled"  # peers' groups outside their sender's public schedule, dropped
FETCH_RESUMES = "swarm/fetch_resumes"  # downloads continued on a new stream after a cut (relay budgets)
NEIGHBORS_EVICTED = "swarm/neighbors_evicted"  # neighbours that lost their slot: idle (delivered nothing) or graylisted
STREAMS_OVER_RATE = "swarm/streams_over_rate"  # incoming streams closed unread and DHT requests refused unparsed: their peer was over its rate (or the DHT request over its size)
PEERS_GRAYLISTED = "swarm/peers_graylisted"  # peers ignored for a while: over their stream rate too often
SHIELDS = "swarm/shields"  # times the node stopped serving strangers' streams or DHT requests against a flood (net/shield.py)
MESH_OUTBOUND, MESH_CREDITED = "swarm/mesh_outbound", "swarm/mesh_credited"  # neighbours we dialled; that
#   delivered an accepted packet within idle_rounds (net/scores.py), at the round's end
KNOCKER_TURNS = "swarm/knocker_turns"  # starving: peers we had no slot for, fetched from in turn (net/knockers.py)
KNOCKERS_PROVEN = "swarm/knockers_proven"  # of those, how many a step has taken packets from so far (dialled first)
REJECTED_PREFIX = "swarm/rejected/"  # + reason
PEER_PREFIX = "peer/"  # group statistics of the peer groups used, e.g. peer/reward/mean


class MetricsError(SwarmNodeError):
    """metrics.jsonl cannot be written (disk full, unwritable directory)."""


def read_metrics(path: str | Path) -> list[dict]:
    """All rounds of a metrics.jsonl file (a torn last line from a crash is skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def set_aside(path: str | Path) -> Path | None:
    """Before a fresh (not resumed) run: move a previous run's metrics file to `<stem>.previous-N<suffix>`
    so that one file never mixes two runs (each restarting at round 0); where it went, or None."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return None
    n = 1
    while (aside := path.with_name(f"{path.stem}.previous-{n}{path.suffix}")).exists():
        n += 1
    try:
        path.rename(aside)
    except OSError as e:
        raise MetricsError(f"cannot move the previous run's {path} aside: {e.strerror or e}") from None
    log.warning("%s held a previous run's metrics: moved to %s (pass --resume to continue a run instead)",
                path, aside.name)
    return aside


def drop_rounds_after(path: str | Path, last_round: int) -> int:
    """Rewrite `path` (atomically) without the rows of rounds > `last_round`; returns how many went."""
    path = Path(path)
    if not path.exists():
        return 0
    rows = read_metrics(path)
    keep = [row for row in rows if isinstance(row.get("round"), int) and row["round"] <= last_round]
    if len(keep) == len(rows):
        return 0
    try:
        write_atomic(path, "".join(json.dumps(row) + "\n" for row in keep))
    except OSError as e:
        raise MetricsError(f"cannot rewrite {path}: {e.strerror or e}") from None
    log.warning("resume: dropped %d metrics rows of rounds after %d (they are trained again)",
                len(rows) - len(keep), last_round)
    return len(rows) - len(keep)


class MetricsWriter:
    """Appends one JSON object per round to a file (created if needed); raises MetricsError on I/O errors."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.failed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a")
            if self._file.tell() > 0:  # a torn last line (crash mid-write) must not swallow the next row
                with self.path.open("rb") as f:
                    f.seek(-1, 2)  # the last byte
                    if f.read(1) != b"\n":
                        self._file.write("\n")
                        self._file.flush()
        except OSError as e:
            raise MetricsError(f"cannot write {self.path}: {e.strerror or e}") from None

    def write(self, row: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        try:
            self._file.write(json.dumps(clean) + "\n")
            self._file.flush()
        except OSError as e:
            self.failed = True
            raise MetricsError(f"cannot write {self.path} (round {row.get('round')} not recorded): "
                               f"{e.strerror or e}") from None

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as e:
            if not self.failed:  # the failure was already reported by write()
                raise MetricsError(f"cannot write {self.path}: {e.strerror or e}") from None


def summary_line(row: dict) -> str:
    """One short human line per round, e.g. `round 7 | reward 0.42 | acc 0.31 | peers 2 | ...`."""
    parts = [f"round {row.get('round', '?')}"]
    for key, label, fmt in ((REWARD_MEAN, "reward", "{:.2f}"), (EVAL_ACCURACY, "acc", "{:.3f}"),
                            (PEERS, "peers", "{}"), (PEER_GROUPS_USED, "peer groups", "{}"),
                            ("filter/dropped_frac", "filtered", "{:.2f}"), ("is/truncated_frac", "trunc", "{:.2f}"),
                            (TIME_ROUND, "s", "{:.1f}")):
        if row.get(key) is not None:
            parts.append(f"{label} {fmt.format(row[key])}")
    return " | ".join(parts)

"""Metrics: one flat dict of namespaced keys per round, appended to `metrics.jsonl`.

Keys follow TRL/cleanrl habits: `reward/mean`, `eval/accuracy`, `is/truncated_frac`,
`filter/dropped_frac`, `swarm/peers`, `time/generate_s`, ... A round's line is written and
flushed as soon as the round ends, so a crash never loses a finished round.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict]:
    """All rounds of a metrics.jsonl file (a torn last line from a crash is skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class MetricsWriter:
    """Appends one JSON object per round to a file (created if needed)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, row: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def summary_line(row: dict) -> str:
    """One short human line per round, e.g. `round 7 | reward 0.42 | acc 0.31 | peers 2 | ...`."""
    parts = [f"round {row.get('round', '?')}"]
    for key, label, fmt in (("reward/mean", "reward", "{:.2f}"), ("eval/accuracy", "acc", "{:.3f}"),
                            ("swarm/peers", "peers", "{}"), ("swarm/peer_groups_used", "peer groups", "{}"),
                            ("filter/dropped_frac", "filtered", "{:.2f}"), ("is/truncated_frac", "trunc", "{:.2f}"),
                            ("time/round_s", "s", "{:.1f}")):
        if row.get(key) is not None:
            parts.append(f"{label} {fmt.format(row[key])}")
    return " | ".join(parts)

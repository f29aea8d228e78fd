"""Where a dataset-backed task reads its records from: local JSONL files or the HF hub.

The ``data`` argument of :func:`swarm_node.tasks.load_task` is one of

* a local directory holding ``<split>.jsonl`` files (``train.jsonl``,
  ``test.jsonl``; a missing file means that split is absent);
* a single local ``.jsonl`` file: its split is its file stem when that is a
  split name (``test.jsonl`` -> ``"test"``), else the task's default split;
* a Hugging Face hub dataset id such as ``"openai/gsm8k"``, loaded with
  :func:`datasets.load_dataset` (needs network access, or a populated HF cache);
* ``None``: ``$SWARM_NODE_DATA/<task subdir>`` when the environment variable
  :data:`DATA_ENV` is set, else the task's hub id.

A string that names no existing path is taken as a hub id only if it looks
like one (``name`` or ``owner/name``); anything path-like that does not exist
(``/x``, ``./x``, ``~/x``, ``a/b/c``, ``*.jsonl``) raises ``FileNotFoundError``
rather than silently going to the network.

Records are plain ``dict`` objects; a record's index is its position among the
file's non-blank lines (or in the hub split), and tasks build ids from it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATA_ENV", "Records", "load_records"]

logger = logging.getLogger(__name__)

#: Environment variable naming a local data root with one subdirectory per task.
DATA_ENV = "SWARM_NODE_DATA"

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?", re.ASCII)


@dataclass(frozen=True)
class Records:
    """Raw records per available split, and a human-readable description of the source."""

    splits: dict[str, list[dict]]
    source: str


def load_records(
    data: str | os.PathLike | None,
    *,
    subdir: str,
    hub_id: str,
    split_names: tuple[str, ...],
    default_split: str,
    hub_config: str | None = None,
) -> Records:
    """Read the records of every available split named in ``split_names``.

    Args:
        data: See the module docstring.
        subdir: The task's directory under ``$SWARM_NODE_DATA``.
        hub_id: The task's default hub dataset id.
        split_names: Splits to look for.
        default_split: Split of a single ``.jsonl`` file whose stem is not a split name.
        hub_config: Config name passed to :func:`datasets.load_dataset` (e.g. ``"main"``).
    """
    if data is None:
        root = os.environ.get(DATA_ENV)
        if root:
            data = Path(root).expanduser() / subdir
            if not data.exists():
                raise FileNotFoundError(f"{DATA_ENV}={root!r} has no {subdir!r} directory ({data})")
        else:
            data = hub_id
    text = os.fspath(data)
    path = Path(text).expanduser()
    if path.is_dir():
        files = {s: path / f"{s}.jsonl" for s in split_names if (path / f"{s}.jsonl").is_file()}
        if not files:
            wanted = ", ".join(f"{s}.jsonl" for s in split_names)
            raise FileNotFoundError(f"{path} holds none of: {wanted}")
        return Records({s: read_jsonl(f) for s, f in files.items()}, str(path))
    if path.is_file():
        split = path.stem if path.stem in split_names else default_split
        return Records({split: read_jsonl(path)}, str(path))
    if isinstance(data, os.PathLike) or text.endswith(".jsonl") or not _HUB_ID.fullmatch(text):
        raise FileNotFoundError(f"no such data file or directory: {text!r}")
    return load_hub(text, hub_config, split_names)


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file (blank lines skipped)."""
    records: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({e})") from e
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object")
            records.append(record)
    logger.debug("read %d records from %s", len(records), path)
    return records


def load_hub(hub_id: str, config: str | None, split_names: tuple[str, ...]) -> Records:
    """Records of the splits in ``split_names`` that hub dataset ``hub_id`` has."""
    import datasets  # heavy import; only needed on this path

    logger.info("loading %s (config %s) from the Hugging Face hub", hub_id, config)
    try:
        dataset = datasets.load_dataset(hub_id, config) if config else datasets.load_dataset(hub_id)
    except (OSError, ConnectionError, ValueError) as e:  # no network, no such dataset, offline mode
        raise OSError(f"cannot load hub dataset {hub_id!r} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                      "without hub access pass --data PATH (a directory with train.jsonl/test.jsonl, or a .jsonl file)"
                      ) from None
    splits = {s: [dict(row) for row in dataset[s]] for s in split_names if s in dataset}
    if not splits:
        raise ValueError(f"hub dataset {hub_id!r} has none of the splits {split_names}")
    return Records(splits, f"hf://{hub_id}" + (f"[{config}]" if config else ""))

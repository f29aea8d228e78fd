"""Rate-limited logging: a flood of the same warning becomes one line per interval with a count.

A hostile peer can make the node fail the same way thousands of times a second (refused streams,
"Too many open files", rejected packets); logged line by line that filled 48 MB of node.log in
90 s (issue 18 point 5). `RepeatFilter` lets through, per interval, the first WARNING-or-worse
record of each cause (logger + message template, so `log.warning("x %s", a)` is one cause
whatever `a` is) and at most `per_logger` records of each logger (for libraries that format their
messages themselves, e.g. hivemind's f-strings); the next line let through says how many were
suppressed:

    12:00:11 WARNING swarm_node.swarm.exchange: rejected packet sha256:ab.. from Qm..: stale [+431 repeats suppressed]

INFO and DEBUG records always pass (the node's one line per round is INFO). Install one filter
on every handler, so the file and stderr agree:

    limit_repeats(logging.getLogger().handlers)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

INTERVAL_S = 10.0  # a cause logs at most once per this many seconds
PER_LOGGER = 20  # records of one logger per interval at most, whatever their templates
MAX_CAUSES = 1024  # causes remembered at once (the oldest is forgotten first)


class _Window:
    """One interval of one cause or logger: when it began, how many passed and were suppressed."""

    __slots__ = ("start", "passed", "suppressed")

    def __init__(self, start: float):
        self.start, self.passed, self.suppressed = start, 0, 0


class RepeatFilter(logging.Filter):
    """Drops repeats of WARNING+ records within `interval_s` per (logger, template) and beyond
    `per_logger` per logger. Thread-safe; one decision per record, remembered on the record, so
    several handlers sharing the filter agree."""

    def __init__(self, interval_s: float = INTERVAL_S, per_logger: int = PER_LOGGER, clock=time.monotonic):
        super().__init__()
        self.interval_s, self.per_logger, self.clock = interval_s, per_logger, clock
        self.causes: OrderedDict[tuple, _Window] = OrderedDict()
        self.loggers: OrderedDict[str, _Window] = OrderedDict()
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, "_repeat_filter", None)
        if decided is None:
            with self.lock:
                decided = record.levelno < logging.WARNING or self._decide(record)
            record._repeat_filter = decided
        return decided

    def _decide(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        cause = self._window(self.causes, (record.name, record.levelno, str(record.msg)), now)
        logger = self._window(self.loggers, record.name, now)
        if cause.passed:
            cause.suppressed += 1
            return False
        if logger.passed >= self.per_logger:
            logger.suppressed += 1
            return False
        cause.passed += 1
        logger.passed += 1
        notes = [f"+{cause.suppressed} repeats"] if cause.suppressed else []
        notes += [f"+{logger.suppressed} other lines of {record.name}"] if logger.suppressed else []
        if notes:
            try:
                record.msg, record.args = f"{record.getMessage()} [{', '.join(notes)} suppressed]", None
            except Exception:  # a malformed record: the handler reports it as usual
                pass
            cause.suppressed = logger.suppressed = 0
        return True

    def _window(self, windows: OrderedDict, key, now: float) -> _Window:
        """The current interval's window of `key`; a new interval carries over the suppressed count."""
        window = windows.get(key)
        if window is None:
            window = windows[key] = _Window(now)
            while len(windows) > MAX_CAUSES:
                windows.popitem(last=False)
        elif now - window.start >= self.interval_s:
            window.start, window.passed = now, 0
        windows.move_to_end(key)
        return window


def limit_repeats(handlers: list[logging.Handler], interval_s: float = INTERVAL_S,
                  per_logger: int = PER_LOGGER) -> RepeatFilter:
    """Install one shared `RepeatFilter` on `handlers`; returns it."""
    repeat_filter = RepeatFilter(interval_s, per_logger)
    for handler in handlers:
        handler.addFilter(repeat_filter)
    return repeat_filter

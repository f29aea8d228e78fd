"""logutil.py: a flood of repeated warnings becomes one line per cause per interval, with a count."""
from __future__ import annotations

import io
import logging

from swarm_node.logutil import RepeatFilter, limit_repeats


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _logging_to(stream: io.StringIO, clock: Clock, name: str, **kw) -> tuple[logging.Logger, list[logging.Handler]]:
    handlers = [logging.StreamHandler(stream), logging.StreamHandler(stream)]  # like node.log + stderr
    shared = RepeatFilter(clock=clock, **kw)
    for h in handlers:
        # levelno, not levelname: hivemind renames WARNING to WARN when it is imported (order-dependent)
        h.setFormatter(logging.Formatter("%(levelno)s %(name)s: %(message)s"))
        h.addFilter(shared)
    logger = logging.getLogger(name)
    logger.propagate, logger.level = False, logging.INFO
    for h in handlers:
        logger.addHandler(h)
    return logger, handlers


def test_one_line_per_cause_per_interval_then_the_count():
    out, clock = io.StringIO(), Clock()
    log, handlers = _logging_to(out, clock, "test.repeats", interval_s=10.0, per_logger=100)
    try:
        for i in range(5000):  # a flood: same template, different arguments
            log.warning("rejected packet %d from %s", i, "QmEvil")
            log.error("accept failed: %s", OSError(24, "Too many open files"))
        log.info("round %d done", 1)  # INFO always passes
        log.info("round %d done", 2)
        clock.now = 10.0
        log.warning("rejected packet %d from %s", 5000, "QmEvil")
        lines = out.getvalue().splitlines()
        # each line twice: the two handlers share one decision per record
        assert lines[::2] == lines[1::2]
        assert lines[::2] == [
            "30 test.repeats: rejected packet 0 from QmEvil",
            "40 test.repeats: accept failed: [Errno 24] Too many open files",
            "20 test.repeats: round 1 done",
            "20 test.repeats: round 2 done",
            "30 test.repeats: rejected packet 5000 from QmEvil [+4999 repeats suppressed]",
        ]
        assert len(out.getvalue()) < 1000  # instead of 2 x 10,000 lines
    finally:
        for h in handlers:
            log.removeHandler(h)


def test_messages_formatted_by_the_caller_are_capped_per_logger():
    """f-string messages (hivemind's style) are each their own template: the per-logger cap bounds them."""
    out, clock = io.StringIO(), Clock()
    log, handlers = _logging_to(out, clock, "test.fstrings", interval_s=10.0, per_logger=3)
    try:
        for i in range(1000):
            log.warning(f"stream {i} failed")
        clock.now = 10.5
        log.warning("stream %d failed", 1000)
        lines = out.getvalue().splitlines()[::2]
        assert lines == ["30 test.fstrings: stream 0 failed", "30 test.fstrings: stream 1 failed",
                         "30 test.fstrings: stream 2 failed",
                         "30 test.fstrings: stream 1000 failed [+997 other lines of test.fstrings suppressed]"]
    finally:
        for h in handlers:
            log.removeHandler(h)


def test_limit_repeats_installs_one_filter_and_a_malformed_record_is_not_an_error():
    handlers = [logging.StreamHandler(io.StringIO()) for _ in range(2)]
    shared = limit_repeats(handlers)
    assert all(h.filters == [shared] for h in handlers)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "bad %d", ("not a number",), None)
    assert shared.filter(record) and shared.filter(record)  # first of its cause: passes, formatting untouched
    repeat = logging.LogRecord("x", logging.WARNING, __file__, 1, "bad %d", ("still not",), None)
    assert not shared.filter(repeat)

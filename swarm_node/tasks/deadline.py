"""A thread-safe time limit for pure-Python work (used around sympy in math500 grading).

math-verify's own timeouts use ``signal.alarm``: they only work on the main
thread and would clobber any other ``SIGALRM`` user (pytest-timeout, for one).
We switch those off and use :func:`call_with_deadline` instead: a timer thread
raises :class:`DeadlineExceeded` *inside the calling thread* through CPython's
``PyThreadState_SetAsyncExc``. That works on any thread, like a signal it is
delivered between bytecodes, so it interrupts sympy's Python-level loops
(``9^{9^{9}}`` simplification, huge factorials) but not one long C call.

``DeadlineExceeded`` derives from ``BaseException`` so that the ``except
Exception`` blocks inside math-verify and sympy do not swallow it. On an
interpreter without ``ctypes.pythonapi`` the function runs without a limit.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["DeadlineExceeded", "call_with_deadline"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class DeadlineExceeded(BaseException):
    """Raised in a thread whose :func:`call_with_deadline` ran out of time."""


try:  # a private prototype, so we never touch ctypes.pythonapi's shared argtypes
    _set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
        ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
    )
except (AttributeError, OSError):  # not CPython
    _set_async_exc = None


def call_with_deadline(fn: Callable[[], T], seconds: float | None) -> T:
    """Return ``fn()``, or raise :class:`TimeoutError` once ``seconds`` have passed.

    ``seconds=None`` (or a non-positive value) means no limit.
    """
    if seconds is None or seconds <= 0 or _set_async_exc is None:
        return fn()
    ident = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                _set_async_exc(ident, ctypes.py_object(DeadlineExceeded))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    try:
        try:
            timer.start()
            return fn()
        finally:
            # The async exception may land anywhere in here too; the outer
            # handler catches it. Once "done" is set under the lock the timer
            # can no longer fire, and a still-pending exception is cleared.
            with lock:
                state["done"] = True
            timer.cancel()
            if state["fired"]:
                _set_async_exc(ident, ctypes.py_object())  # NULL: clear if still pending
    except DeadlineExceeded:
        raise TimeoutError(f"gave up after {seconds} s") from None

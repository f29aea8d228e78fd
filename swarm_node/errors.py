"""Errors a user can cause, and only those.

`SwarmNodeError` is the base of every error whose cause lies outside the program: a bad flag or
config value, a model or dataset that cannot be loaded, an identity already in use, a full disk,
an unreachable peer. The CLI turns exactly these into one `error: ...` line and exit code 2;
every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class SwarmNodeError(Exception):
    """A user-caused failure with one clear message (no traceback is shown for it)."""

"""Under CI (`CI=true`) a skipped test fails, unless its reason starts with one of `MAY_SKIP_IN_CI`.

A missing prerequisite (nftables, podman, wandb, vllm, a packaged model ...) must be installed by
the project's own set-up (`make test` runs tests/host-packages.sh), never silently cost CI its
tests. Outside CI such a test skips, with the install command in its reason. Loaded from
tests/conftest.py as a plugin.
"""

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Skips that are right on CI's machine too: what this kind of machine cannot have (a GPU), or what
# its circumstances make meaningless (e.g. running as root). Every other reason fails under CI.
MAY_SKIP_IN_CI = ("needs a GPU", "not applicable:")


def _fail_skip_under_ci(report):
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if not reason.startswith(MAY_SKIP_IN_CI):
            report.outcome = "failed"
            report.longrepr = f"skipped under CI=true, where every prerequisite must be installed: {reason}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped for a reason not in MAY_SKIP_IN_CI fails under CI."""
    return _fail_skip_under_ci((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped at collection (e.g. a module-level importorskip)."""
    return _fail_skip_under_ci((yield))

"""
Suite-wide hooks.

Under ``CI=true`` a skipped, xfailed or xpassed test fails the run, whatever its directory: in
CI a missing dependency (git, pygit2, a free address ...) must be installed, never silently
skipped, and a test expected to fail is a test that cannot fail.
"""

import collections
import logging
import os
import sys

import pytest

# What pytest's terminal reporter counts that CI does not accept.
_NOT_RUN_AS_WRITTEN = ("skipped", "xfailed", "xpassed")


def _in_ci():
    return os.environ.get("CI", "").strip().lower() == "true"


def _not_run_as_written(config):
    """
    ``(outcome, report)`` of every test that was skipped, xfailed or xpassed.
    """
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    return [
        (outcome, report)
        for outcome in _NOT_RUN_AS_WRITTEN
        for report in reporter.stats.get(outcome, [])
        if getattr(report, "nodeid", None)
    ]


def pytest_sessionfinish(session, exitstatus):
    if not (_in_ci() and _not_run_as_written(session.config)):
        return
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _reason(report):
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    return getattr(report, "wasxfail", None) or report.longrepr


# Seconds spent in each test module (setup, call and teardown of its tests): where CI time goes.
_MODULE_SECONDS = collections.Counter()


def pytest_runtest_logreport(report):
    _MODULE_SECONDS[report.nodeid.split("::", 1)[0]] += report.duration


def _module_times(terminalreporter):
    slow = [(path, secs) for path, secs in _MODULE_SECONDS.most_common() if secs >= 10]
    if not slow:
        return
    terminalreporter.section("seconds per test module (10 s or more)")
    for path, secs in slow:
        terminalreporter.line(f"{secs:8.0f}  {path}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    _module_times(terminalreporter)
    if not _in_ci():
        return
    found = _not_run_as_written(config)
    if not found:
        return
    terminalreporter.section("tests not run as written under CI=true", red=True, bold=True)
    for outcome, report in found:
        terminalreporter.line(f"{report.nodeid} ({outcome}): {_reason(report)}", red=True)
    terminalreporter.line(
        f"{len(found)} test(s) skipped, xfailed or xpassed: the run fails (install what they "
        "need; a test must be able to fail)",
        red=True,
        bold=True,
    )


def pytest_unconfigure(config):
    """
    Salt installs, at import, a deferred stderr handler that keeps WARNING records (the daemons'
    logs forwarded by salt-factories) and flushes them at interpreter exit into pytest's closed
    capture stream ("--- Logging error ---" noise). pytest has reported them already: drop them.
    """
    impl = sys.modules.get("salt._logging.impl")
    handler = impl.get_temp_handler() if impl else None
    if handler is not None:
        logging.root.removeHandler(handler)
        handler.sync_with_handlers(())

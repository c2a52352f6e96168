"""
Suite-wide hooks.

Under ``CI=true`` a skipped integration test fails the run: in CI a missing dependency (git,
pygit2, a free loopback address ...) must be fixed, never silently skipped.
"""

import logging
import os
import pathlib
import sys

import pytest

INTEGRATION_DIR = pathlib.Path(__file__).resolve().parent / "integration"


def _in_ci():
    return os.environ.get("CI", "").strip().lower() == "true"


def _skipped_integration(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    skipped = []
    for report in reporter.stats.get("skipped", []):
        path = (config.rootpath / report.nodeid.split("::")[0]).resolve()
        if path == INTEGRATION_DIR or INTEGRATION_DIR in path.parents:
            skipped.append(report)
    return skipped


def pytest_sessionfinish(session, exitstatus):
    if not (_in_ci() and _skipped_integration(session.config)):
        return
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _in_ci():
        return
    skipped = _skipped_integration(config)
    if not skipped:
        return
    terminalreporter.section("integration tests skipped under CI=true", red=True, bold=True)
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        terminalreporter.line(f"{report.nodeid}: {reason}", red=True)
    terminalreporter.line(
        f"{len(skipped)} integration test(s) skipped: the run fails (install what they need)",
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

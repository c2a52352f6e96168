"""
Under ``CI=true`` the suite fails when any test was skipped, xfailed or xpassed, in any test
directory (``tests/conftest.py``); outside CI they are reported as pytest reports them.
"""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

CONFTEST = pathlib.Path(__file__).resolve().parents[2] / "conftest.py"
XFAIL = "import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_it():\n"
CASES = {
    "skipped": "import pytest\n\ndef test_it():\n    pytest.skip('no dependency')\n",
    "xfailed": XFAIL + "    assert 0\n",
    "xpassed": XFAIL + "    pass\n",
}


def run_suite(tmp_path, body, ci):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "unit").mkdir()
    (tmp_path / "unit" / "test_case.py").write_text(body)
    env = {**os.environ, "CI": "true" if ci else ""}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("outcome", sorted(CASES))
def test_ci_fails_a_run_with_a_test_not_run_as_written(tmp_path, outcome):
    result = run_suite(tmp_path, CASES[outcome], ci=True)
    assert result.returncode == 1, result.stdout
    assert f"test_it ({outcome})" in result.stdout


@pytest.mark.parametrize("outcome", sorted(CASES))
def test_outside_ci_the_outcome_is_pytest_s(tmp_path, outcome):
    assert run_suite(tmp_path, CASES[outcome], ci=False).returncode == 0


def test_ci_passes_a_run_where_every_test_ran(tmp_path):
    assert run_suite(tmp_path, "def test_it():\n    pass\n", ci=True).returncode == 0

"""
Shared by every unit test. The formula's loader modules are loaded once per test module by
module-scoped fixtures: the execution module here (``modules/`` and ``states/`` both call it),
the others in the conftest of the directory that tests them. pytest-salt-factories' loader mock
gives them fresh dunders for each test through the test module's ``configure_loader_modules``.
"""

import pytest

from tests.support.loading import load_for, read_defaults


@pytest.fixture
def defaults():
    return read_defaults()


@pytest.fixture
def masters():
    return [
        {"id": "master1", "host": "10.0.3.61"},
        {"id": "master2", "host": "10.0.3.230"},
    ]


@pytest.fixture(scope="module")
def mod(request):
    """
    The execution module (``_modules/multimaster.py``), which the state module calls too.
    """
    return load_for(request, "_modules/multimaster.py")


@pytest.fixture(scope="module")
def daemons(request):
    """
    The daemons execution module (``_modules/multimaster_daemons.py``), which the state module
    calls too.
    """
    return load_for(request, "_modules/multimaster_daemons.py")

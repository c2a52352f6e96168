import pytest

from tests.support.loading import read_defaults


@pytest.fixture
def defaults():
    return read_defaults()


@pytest.fixture
def masters():
    return [
        {"id": "master1", "host": "10.0.3.61"},
        {"id": "master2", "host": "10.0.3.230"},
    ]

import pytest

from tests.support.loading import load_for


@pytest.fixture(scope="module")
def state(request):
    """
    The state module (``_states/multimaster.py``).
    """
    return load_for(request, "_states/multimaster.py")

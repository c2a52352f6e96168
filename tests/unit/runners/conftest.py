import pytest

from tests.support.loading import load_for


@pytest.fixture(scope="module")
def transfer(request):
    """
    The transfer runner (``_runners/multimaster_transfer.py``).
    """
    return load_for(request, "_runners/multimaster_transfer.py")

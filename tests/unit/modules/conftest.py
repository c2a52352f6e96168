import pytest

from tests.support.loading import load_for


@pytest.fixture(scope="module")
def peer(request):
    """
    The control minions' execution module (``_modules/multimaster_peer.py``).
    """
    return load_for(request, "_modules/multimaster_peer.py")

import pytest

from tests.support.loading import load_for


@pytest.fixture(scope="module")
def backend(request):
    """
    The file server backend (``_fileserver/multimaster.py``).
    """
    return load_for(request, "_fileserver/multimaster.py")

"""
Fixtures for the tests on separate hosts (``toolkit/hosts.py``): Linux namespaces with
their own address, hostname and Salt directories, Salt on its default paths.
"""

import pytest

from toolkit import hosts as nshosts


@pytest.fixture(scope="module")
def host_set(request):
    """
    The module's ``HOSTS`` (name -> address) as separate hosts (named with its ``PREFIX``, default
    ``mm``), removed after the module; on a failure the daemons' logs are printed first.
    """
    prefix = getattr(request.module, "PREFIX", "mm")
    hosts = nshosts.HostSet(
        [nshosts.Host(n, a) for n, a in request.module.HOSTS.items()], prefix=prefix
    )
    hosts.up()
    yield hosts
    for host in hosts:
        for log in ("master", "minion"):
            print(f"--- {host.name} /var/log/salt/{log}\n{host.log(log, tail=40)}")
    hosts.down()

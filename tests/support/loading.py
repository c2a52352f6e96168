"""
Shared by the unit tests: the repository root, the formula defaults, and loading ``_modules``/
``_states``/``_runners`` files under distinct module names (they are all called ``multimaster``).
The formula's ``_utils`` is on ``sys.path`` through pytest's ``pythonpath`` (as Salt puts
``extmods/utils`` there for loaded modules). A test module hands a loaded module to
pytest-salt-factories' loader mock through its ``configure_loader_modules`` fixture, which
patches in the loader dunders for each test.
"""

import copy
import importlib.util
import pathlib

import salt.config
import salt.utils.dictupdate
import salt.utils.yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
UTILS = ROOT / "_utils"


def load_module(name, relpath):
    """
    Import ``relpath`` (relative to the repository root) as a fresh module called ``name``,
    without loader dunders: ``configure_loader_modules`` provides them.
    """
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_for(request, relpath):
    """
    ``relpath`` loaded for the test module that ``request`` (a module-scoped fixture's) serves,
    under a name of its own: each test module has a copy of its own, so that nothing one test
    module leaves on a loaded module reaches another.
    """
    kind, _, stem = relpath.removesuffix(".py").lstrip("_").partition("/")
    return load_module(f"{stem}_{kind}_for_{request.module.__name__.rpartition('.')[2]}", relpath)


def _values(path):
    with open(path, encoding="utf-8") as handle:
        return salt.utils.yaml.safe_load(handle)["values"]


def read_defaults(os_family="Debian"):
    """
    The ``values`` of ``multimaster/parameters/defaults.yaml`` with those of
    ``parameters/os_family/<os_family>.yaml`` merged over them, as the execution module stacks
    them on a minion of that family (``None``: defaults.yaml alone).
    """
    parameters = ROOT / "multimaster" / "parameters"
    values = _values(parameters / "defaults.yaml")
    if os_family:
        values = salt.utils.dictupdate.update(
            values, _values(parameters / "os_family" / f"{os_family}.yaml"), recursive_update=True
        )
    return values


def master_opts(tmp_path, **extra):
    """
    Salt's default master options with ``pki_dir``, ``cachedir`` and ``sock_dir`` made under
    ``tmp_path``, id ``master1`` and the current user; ``extra`` on top.
    """
    opts = copy.deepcopy(salt.config.DEFAULT_MASTER_OPTS)
    opts.update(
        {
            "pki_dir": str(tmp_path / "pki"),
            "cachedir": str(tmp_path / "cache"),
            "sock_dir": str(tmp_path / "sock"),
            "id": "master1",
            "user": None,
            "__role": "master",
        },
        **extra,
    )
    for name in ("pki", "cache", "sock"):
        (tmp_path / name).mkdir(exist_ok=True)
    return opts


def cluster_section(addresses):
    """
    A mode-cluster pillar section of masters at ``addresses`` (id = address, control minions
    ``cm1``…), behind the balancer 10.0.0.10.
    """
    return {
        "mode": "cluster",
        "ports": {"publish": 4505, "ret": 4506},
        "masters": [
            {"id": a, "host": a, "config_dir": f"/srv/{a}", "minion_id": f"cm{i + 1}"}
            for i, a in enumerate(addresses)
        ],
        "cluster": {"balancer": "10.0.0.10", "id": "prod"},
    }


# A hot pair, m1 (the primary) and m2, with control minions cm1 and cm2.
HOT_PAIR = {
    "mode": "hot",
    "ports": {"publish": 4505, "ret": 4506},
    "masters": [
        {"id": "m1", "host": "10.0.0.1", "minion_id": "cm1", "config_dir": "/etc/salt"},
        {"id": "m2", "host": "10.0.0.2", "minion_id": "cm2", "config_dir": "/etc/salt"},
    ],
}

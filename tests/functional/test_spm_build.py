"""
``FORMULA`` carries the SPM metadata and ``spm build`` of the formula succeeds; the package holds
the formula, its modules and pillar.example, and ``spm local install`` lays them out as Salt
expects. SPM runs as the user would run it, with a config dir of its own under tmp.
"""

import pathlib
import subprocess
import sys
import tarfile

import pytest
import salt.utils.yaml
import tomllib

from toolkit import devkit

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPM = pathlib.Path(sys.executable).parent / "spm"
# What a checkout holds besides the formula (spm matches these as prefixes of member names).
EXCLUDE = [
    ".git",
    ".venv",
    ".pytest_cache",
    ".ruff_cache",
    ".ci",
    "lab",
    "toolkit",
    "tests",
    "bench",
    "dist",
    *(f"{d}/__pycache__" for d in devkit.FORMULA_PARTS if d.startswith("_")),
]


def formula():
    with open(ROOT / "FORMULA", encoding="utf-8") as handle:
        return salt.utils.yaml.safe_load(handle)


def test_formula_metadata():
    meta = formula()
    for key in (
        "name",
        "os",
        "os_family",
        "version",
        "release",
        "minimum_version",
        "summary",
        "description",
        "top_level_dir",
    ):
        assert meta.get(key) not in (None, ""), f"FORMULA lacks {key}"
    assert meta["name"] == meta["top_level_dir"] == "multimaster"
    assert (ROOT / meta["top_level_dir"] / "init.sls").is_file()
    # The oldest Salt line CI runs (requirements.txt: `# salt-3006: ...`, .ci/run).
    assert int(str(meta["minimum_version"]).split(".", maxsplit=1)[0]) == 3006
    with open(ROOT / "pyproject.toml", "rb") as handle:
        assert str(meta["version"]) == tomllib.load(handle)["project"]["version"]


@pytest.fixture
def spm(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    settings = {
        "root_dir": str(tmp_path / "root"),
        "spm_build_dir": str(tmp_path / "build"),
        "formula_path": str(tmp_path / "srv" / "spm" / "salt"),
        "pillar_path": str(tmp_path / "srv" / "spm" / "pillar"),
        "reactor_path": str(tmp_path / "srv" / "spm" / "reactor"),
        "spm_cache_dir": str(tmp_path / "cache"),
        "spm_db": str(tmp_path / "cache" / "packages.db"),
        "spm_share_dir": str(tmp_path / "share"),
        "spm_repos_config": str(conf / "spm.repos"),
        "spm_logfile": str(tmp_path / "spm.log"),
        "log_file": str(tmp_path / "spm.log"),
        "cachedir": str(tmp_path / "cachedir"),
        "pki_dir": str(tmp_path / "pki"),
        "spm_build_exclude": EXCLUDE,
    }
    with open(conf / "spm", "w", encoding="utf-8") as handle:
        salt.utils.yaml.safe_dump(settings, handle)

    def run(*args):
        proc = subprocess.run(
            [str(SPM), "-c", str(conf), "-y", *args],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert proc.returncode == 0, f"spm {args}: {proc.stdout}{proc.stderr}"
        return proc.stdout

    run.settings = settings
    return run


def test_spm_build_and_install(spm):
    meta = formula()
    out = spm("build", str(ROOT))
    package = (
        pathlib.Path(spm.settings["spm_build_dir"])
        / f"{meta['name']}-{meta['version']}-{meta['release']}.spm"
    )
    assert f"Built package {package}" in out
    assert package.is_file()
    with tarfile.open(package, "r:bz2") as tar:
        names = set(tar.getnames())
    for member in (
        "multimaster/FORMULA",
        "multimaster/pillar.example",
        "multimaster/multimaster/init.sls",
        "multimaster/multimaster/map.jinja",
        "multimaster/multimaster/parameters/defaults.yaml",
        "multimaster/multimaster/master/config.sls",
        "multimaster/multimaster/minion/config.sls",
        "multimaster/_modules/multimaster.py",
        "multimaster/_states/multimaster.py",
        "multimaster/_utils/multimaster_settings.py",
        "multimaster/_utils/multimaster_pillarcheck.py",
        "multimaster/_fileserver/multimaster.py",
        "multimaster/_engines/multimaster_rootswatch.py",
        "multimaster/_returners/multimaster_pgjsonb.py",
    ):
        assert member in names, f"{member} not in the package"
    strays = sorted(
        n for n in names if any(n.startswith(f"multimaster/{e}") for e in EXCLUDE) or ".pyc" in n
    )
    assert not strays, strays

    spm("local", "install", str(package))
    formulas = pathlib.Path(spm.settings["formula_path"])
    for path in (
        "multimaster/init.sls",
        "multimaster/map.jinja",
        "multimaster/parameters/defaults.yaml",
        "_modules/multimaster.py",
        "_states/multimaster.py",
        "_utils/multimaster_settings.py",
        "_utils/multimaster_pillarcheck.py",
        "_fileserver/multimaster.py",
        "_engines/multimaster_rootswatch.py",
        "_returners/multimaster_pgjsonb.py",
    ):
        assert (formulas / path).is_file(), f"{path} not installed"
    installed = pathlib.Path(spm.settings["pillar_path"]) / "multimaster.sls.orig"
    assert installed.read_text() == (ROOT / "pillar.example").read_text()

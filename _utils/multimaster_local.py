"""
This host's ``multimaster`` settings with every secret in clear: the pillar merged over the
formula defaults and validated, the paths of this minion and of the master it controls, and the
config files derived from them.

Only the formula's state functions read them, to write the files that hold the secrets at run
time. This is a util, not an execution function, on purpose: any execution function can be
published and its return lands in the master's job cache, and any value an SLS renders is
returned by ``state.show_sls`` and cached with the compiled states. The execution module's
``settings`` returns these settings masked.

The loader's dunders are passed in by the calling module: ``salt_funcs`` (``__salt__``: reads
the pillar and the formula's parameters files), ``opts`` (``__opts__``), ``grains``
(``__grains__``) and ``context`` (``__context__``: the defaults are read once per run).
"""

import os

import multimaster_daemon
import multimaster_keystore
import multimaster_saltcompat
import multimaster_settings
import salt.utils.dictupdate
import salt.utils.yaml
from salt.exceptions import CommandExecutionError

PARAMETERS_URL = "salt://multimaster/parameters"
_DEFAULTS_KEY = "multimaster.defaults"


def _values(salt_funcs, url, required):
    """
    The ``values`` of the parameters file at ``url`` on the file server ({} when an optional
    one is missing).
    """
    text = salt_funcs["cp.get_file_str"](url)
    if not text:
        if required:
            raise CommandExecutionError(f"multimaster: cannot read {url}")
        return {}
    return (salt.utils.yaml.safe_load(text) or {}).get("values") or {}


def defaults(salt_funcs, grains, context):
    """
    The formula's defaults: ``parameters/defaults.yaml`` with
    ``parameters/os_family/<os_family>.yaml`` of this minion merged over it (as template-formula
    stacks them), read once per run.
    """
    if _DEFAULTS_KEY not in context:
        family = _values(
            salt_funcs, f"{PARAMETERS_URL}/os_family/{grains.get('os_family')}.yaml", False
        )
        context[_DEFAULTS_KEY] = salt.utils.dictupdate.update(
            _values(salt_funcs, f"{PARAMETERS_URL}/defaults.yaml", True),
            family,
            recursive_update=True,
        )
    return context[_DEFAULTS_KEY]


def first_highstate_mark(opts):
    """
    Where this minion records that its first highstate was claimed.
    """
    # Beside the minion's key, not in its cache: saltutil.clear_cache must not make a set-up
    # minion "new", while a minion whose pki dir is fresh (a new identity) is new.
    return os.path.join(opts["pki_dir"], "multimaster_first_highstate")


def _local_master(merged, opts):
    """
    This host's master entry (the one whose control minion we are) with its paths resolved.
    """
    master = multimaster_settings.local_master(
        merged, opts["id"], os.path.dirname(opts["conf_file"])
    )
    if master is None:
        return None
    master_opts = multimaster_keystore.master_opts(master["config_dir"])
    return dict(
        master,
        pki_dir=master_opts["pki_dir"],
        cachedir=master_opts["cachedir"],
        pidfile=master_opts["pidfile"],
        user=master_opts["user"],
        # Where the master loads synced modules from: the job cache returner goes there.
        extension_modules=master_opts["extension_modules"],
    )


def _own_master_options(merged, master):
    """
    What this master's own config sets, the formula's ``master.d`` files left out.
    """
    lookup = merged["lookup"]
    ours = (
        lookup["config_file"],
        lookup["set_config_file"],
        lookup["cluster_config_file"],
        lookup["job_cache_config_file"],
    )
    return multimaster_keystore.own_master_options(master["config_dir"], ours)


def _configs(merged, local_master):
    """
    The config files of this host: ``minion``, and for a control minion ``master`` plus, where
    the pillar asks for them, ``cluster`` and ``job_cache``.
    """
    configs = {
        "minion": multimaster_settings.minion_config(merged, local_master),
        "master": local_master
        and multimaster_settings.master_config(
            merged, local_master, _own_master_options(merged, local_master)
        ),
        "set": local_master and multimaster_settings.set_config(merged),
    }
    if local_master and merged["mode"] == "cluster":
        configs["cluster"] = multimaster_settings.cluster_config(
            merged, local_master, local_master["pki_dir"]
        )
    if local_master and merged["job_cache"]["enabled"]:
        configs["job_cache"] = multimaster_settings.job_cache_config(merged)
    return configs


def settings(salt_funcs, opts, grains, context, formula_defaults=None):
    """
    The validated settings of this host, secrets in clear: pillar merged over
    ``formula_defaults`` (default: the formula's, see ``defaults``), ``local`` paths and
    ``config`` files. Raises an error naming the bad pillar key before anything changes.
    """
    if formula_defaults is None:
        formula_defaults = defaults(salt_funcs, grains, context)
    merged = multimaster_settings.build(
        multimaster_saltcompat.pillar_section(salt_funcs, "multimaster"), formula_defaults
    )
    local_master = _local_master(merged, opts)
    merged["local"] = {
        "minion_conf_dir": os.path.dirname(opts["conf_file"]),
        "minion_pki_dir": opts["pki_dir"],
        "minion_pidfile": opts["pidfile"],
        "first_highstate_mark": first_highstate_mark(opts),
        "master": local_master,
        # A Salt that has a salt-master already (pip, onedir tarball or package) gets no second.
        "salt_master_installed": multimaster_daemon.script_installed("salt-master"),
        # Only a master needs them (and only its control minion sees the job cache password).
        "python_deps": (
            multimaster_settings.python_deps(merged, multimaster_saltcompat.salt_install())
            if local_master
            else []
        ),
    }
    # The master.d reactors call the formula's runners, and the roots watch is an engine: the
    # master state syncs them before the restart that loads them.
    merged["shares_cluster_aes"] = multimaster_settings.shares_cluster_aes(merged)
    merged["syncs_master_modules"] = multimaster_settings.syncs_master_modules(merged)
    merged["config"] = _configs(merged, local_master)
    return merged

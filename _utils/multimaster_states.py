"""
What the ``multimaster`` states do beyond one execution-module call: the 0600 ``master.d``
files that may hold a secret, the job cache returner put where the master loads it, the job
cache schema, the HAProxy configuration and the master key a master serves. Each ``*_ret``
function returns the state's return (``name``, ``result``, ``changes``, ``comment``).

The state module passes in what its loader dunders hold: ``salt_funcs`` (``__salt__``),
``opts`` (``__opts__``), ``grains``, ``context``, and ``test`` (``__opts__["test"]``).
"""

import difflib
import hashlib
import os
import pwd
import stat

import multimaster_haproxy
import multimaster_jobcache
import multimaster_keys
import multimaster_local
import multimaster_safefs
import salt.utils.yaml
from salt.exceptions import CommandExecutionError


def _ret(name):
    return {"name": name, "result": True, "changes": {}, "comment": ""}


def host_configs(salt_funcs, opts, grains, context):
    """
    This host's config files with the secrets in clear (never returned, never a state argument).
    """
    return multimaster_local.settings(salt_funcs, opts, grains, context)["config"]


def is_current(name, data, mode, owner):
    """
    Whether ``name`` is a regular file (not a link) holding ``data``, of ``mode``, owned by
    ``owner`` (a ``pwd`` entry; None: any owner).
    """
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_mode & 0o777 == mode
        and (owner is None or (st.st_uid, st.st_gid) == (owner.pw_uid, owner.pw_gid))
        and (multimaster_safefs.sha256_file(name) == hashlib.sha256(data).hexdigest())
    )


def write_owned(name, data, mode, owner):
    """
    Write ``data`` to ``name`` with ``mode``, owned by ``owner`` (None: left to this process):
    staged beside it, fsync'd, renamed; never through a link. Raises ``OSError``.
    """
    directory, base = os.path.split(name)
    multimaster_safefs.write_file(directory, base, [data], mode)
    if owner is not None:
        os.chown(name, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def makedirs_owned(directory, owner):
    """
    Create ``directory`` and its missing parents (0755), each owned by ``owner`` (None: left to
    this process).
    """
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for path in reversed(missing):
        os.mkdir(path, 0o755)
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def synced_returner_data(opts, base):
    """
    The content of the returner ``base`` (a file name) as ``saltutil.sync_all`` synced it to
    this minion (``opts``: its options). Raises ``CommandExecutionError`` naming what to run.
    """
    path = os.path.join(opts["extension_modules"], "returners", base)
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise CommandExecutionError(
            f"the formula's returner is not synced to this minion ({path}: "
            f"{exc.strerror or exc}); run saltutil.sync_all on it, then apply again"
        ) from None


def secret_config_ret(name, config, part, user, test):
    """
    Keep ``name`` a 0600 file owned by ``user`` that holds ``config``, this host's ``part``
    config computed at run time (``host_configs``): passed as a state argument, a secret in it
    would be returned by ``state.show_sls`` and stored in the minion's ``highstate.cache.p``
    with the rest of the compiled states. The return never shows the content. Written
    atomically (temp file in the same directory, fsync, rename).
    """
    ret = _ret(name)
    if not config:
        ret.update(result=False, comment=f"no {part} options in the pillar for this master")
        return ret
    data = salt.utils.yaml.safe_dump(config, default_flow_style=False).encode()
    owner = pwd.getpwnam(user) if user else None
    if is_current(name, data, 0o600, owner):
        ret["comment"] = f"{name} is up to date"
        return ret
    if test:
        ret.update(
            result=None, changes={"diff": "<secret: not shown>"}, comment=f"{name} would be updated"
        )
        return ret
    os.makedirs(os.path.dirname(name), mode=0o755, exist_ok=True)
    try:
        # The master may run as its own user: it must read its options; nobody else may.
        write_owned(name, data, 0o600, owner)
    except OSError as exc:
        ret.update(result=False, comment=f"cannot write {name}: {exc.strerror or exc}")
        return ret
    ret.update(changes={"diff": "<secret: not shown>"}, comment=f"{name} updated")
    return ret


def job_cache_returner_ret(name, user, opts):
    """
    ``multimaster.job_cache_returner_installed``: ``name`` made the returner synced to this
    minion (``opts``: its options, ``test`` among them), mode 0644, owned by ``user`` as are
    the directories it creates.
    """
    ret = _ret(name)
    base = os.path.basename(name)
    if base not in [f"{returner}.py" for returner in multimaster_jobcache.RETURNERS]:
        expected = ", ".join(f"{returner}.py" for returner in multimaster_jobcache.RETURNERS)
        ret.update(result=False, comment=f"{name}: expected a file named {expected}")
        return ret
    try:
        data = synced_returner_data(opts, base)
    except CommandExecutionError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    owner = pwd.getpwnam(user) if user else None
    if is_current(name, data, 0o644, owner):
        ret["comment"] = f"{name} is up to date"
        return ret
    action = "updated" if os.path.lexists(name) else "installed"
    if opts["test"]:
        ret.update(result=None, changes={"returner": action}, comment=f"{name} would be {action}")
        return ret
    try:
        makedirs_owned(os.path.dirname(name), owner)
        write_owned(name, data, 0o644, owner)
    except OSError as exc:
        ret.update(result=False, comment=f"cannot write {name}: {exc.strerror or exc}")
        return ret
    ret.update(changes={"returner": action}, comment=f"{name} {action}")
    return ret


def job_cache_schema_ret(name, options, test):
    """
    ``multimaster.job_cache_schema_present``: the job cache tables and trigger created where
    missing in the database ``options`` (this host's ``job_cache`` config; None: not enabled).
    """
    ret = _ret(name)
    if not options:
        ret.update(result=False, comment="the job cache is not enabled in the pillar")
        return ret
    conn = multimaster_jobcache.connection(options)
    where = multimaster_jobcache.describe(conn)
    try:
        missing = multimaster_jobcache.missing_schema(conn)
        if missing and test:
            ret.update(
                result=None,
                changes={"schema": {"old": [], "new": missing}},
                comment=f"{where}: would create {', '.join(missing)}",
            )
            return ret
        if missing:
            missing = multimaster_jobcache.ensure_schema(conn)
    except multimaster_jobcache.JobCacheError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    if missing:
        ret.update(
            changes={"schema": {"old": [], "new": missing}},
            comment=f"{where}: created {', '.join(missing)}",
        )
    else:
        ret["comment"] = f"{where}: the job cache schema is present"
    return ret


def haproxy_config_ret(name, text, test):
    """
    ``multimaster.haproxy_configured``: the file ``name`` made to hold ``text`` once
    ``haproxy -c`` accepts it; the return carries a diff.
    """
    ret = _ret(name)
    current = multimaster_haproxy.read(name)
    if current == text:
        ret["comment"] = f"{name} is up to date"
        return ret
    diff = "".join(
        difflib.unified_diff((current or "").splitlines(True), text.splitlines(True), name, name)
    )
    if test:
        ret.update(result=None, changes={"diff": diff}, comment=f"{name} would be updated")
        return ret
    try:
        multimaster_haproxy.install(name, text)
    except CommandExecutionError as exc:
        ret.update(result=False, comment=str(exc))
        return ret
    ret.update(changes={"diff": diff}, comment=f"{name} updated (haproxy -c accepted it)")
    return ret


def master_key_served_ret(name, fingerprint, signing, salt_funcs, test):
    """
    ``multimaster.master_key_served``: whether this host's master serves the key with
    ``fingerprint``, restarting it once when the stored key has it but the running master
    serves another.
    """
    ret = _ret(name)
    ret["result"] = False
    info = salt_funcs["multimaster_peer.master_key_info"](signing=signing)
    stored = multimaster_keys.fingerprint(info["pub"]) if info["pub"] else None
    if stored != fingerprint:
        ret["comment"] = (
            f"{info['name']} has fingerprint {stored}, not {fingerprint}: "
            "run salt-run multimaster.sync_master_key on the primary"
        )
        return ret
    local = salt_funcs["multimaster.settings"]()
    host, port = local["local"]["master"]["host"], local["ports"]["ret"]
    master_pub, sign_pub = (info["own_pub"], info["pub"]) if signing else (info["pub"], None)
    verify = salt_funcs["multimaster_peer.verify_master_key"]
    check = verify(host, port, master_pub, sign_pub, timeout=5)
    if check["served"]:
        ret.update(result=True, comment=f"The master serves {fingerprint}")
        return ret
    if test:
        ret.update(
            result=None,
            comment=f"The master does not serve {fingerprint} ({check['reason']}); "
            "it would be restarted",
        )
        return ret
    restarted = salt_funcs["multimaster_daemons.restart_master_now"]()
    check = verify(host, port, master_pub, sign_pub, timeout=60)
    ret["changes"] = {"restarted": restarted}
    ret["result"] = check["served"]
    ret["comment"] = (
        f"Restarted; the master now serves {fingerprint}"
        if check["served"]
        else f"Restarted, but the master still does not serve {fingerprint}: {check['reason']}"
    )
    return ret

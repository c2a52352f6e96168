"""
Every SLS of the formula renders with ``pillar.example`` and with each mode, through Salt's own
loader and renderers (``state.show_sls`` on a masterless minion), and the rendered data is what
the pillar asked for. A bad pillar makes every SLS fail to render, naming the key.
"""

import copy
import itertools
import json
import os
import pathlib
import pwd

import pytest
import salt.utils.yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = pathlib.Path(__file__).resolve().parents[2]
FORMULA = ROOT / "multimaster"

# Reactor and orchestrate SLS render only in their own context (event data, runner).
CONTEXT_ONLY = ("reactor", "orch")
# What the first-highstate reactor applies to a new minion reads no pillar (it may have none).
PILLAR_FREE = ("multimaster.minion.first_highstate",)


def sls_names():
    names = []
    for path in sorted(FORMULA.rglob("*.sls")):
        rel = path.relative_to(FORMULA).with_suffix("")
        if rel.parts[0] in CONTEXT_ONLY:
            continue
        parts = ("multimaster", *rel.parts)
        if parts[-1] == "init":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


SLS = sls_names()
REQUIRED_SLS = {
    "multimaster",
    "multimaster.clean",
    "multimaster.master",
    "multimaster.master.clean",
    "multimaster.master.config",
    "multimaster.master.package",
    "multimaster.master.service",
    "multimaster.minion",
    "multimaster.minion.clean",
    "multimaster.minion.config",
    "multimaster.minion.service",
    "multimaster.cluster",
    "multimaster.cluster.config",
    "multimaster.haproxy",
}


def public_pem():
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


SIGN_PUB = public_pem()
MASTERS = [
    {"id": "master1", "host": "127.0.0.2", "config_dir": "/nonexistent/master1"},
    {"id": "master2", "host": "127.0.0.3"},
]


CLUSTER = {"balancer": "127.0.0.10", "id": "c1", "secret": "s" * 40}
# Salt's cluster names a peer by its id and dials it by the same string: ids are addresses.
CLUSTER_MASTERS = [
    {"id": "127.0.0.2", "host": "127.0.0.2", "minion_id": "master1"},
    {"id": "127.0.0.3", "host": "127.0.0.3", "minion_id": "master2"},
]


JOB_CACHE = {"enabled": True, "host": "db.example.com", "password": "pw-marker-0d9e3b"}


def pillar(**extra):
    data = {"masters": [dict(m) for m in MASTERS]}
    data.update(extra)
    return data


# name -> (minion id, pillar); master2's control minion is the minion under test unless said.
VARIANTS = {
    "example": ("master2", (ROOT / "pillar.example").read_text()),
    "hot": ("master2", pillar(mode="hot")),
    "hot-plain-minion": ("web1", pillar(mode="hot")),
    "hot-sse": ("master2", pillar(mode="hot", sse={"enabled": True, "cluster_id": "prod-east"})),
    "failover-sse": (
        "master2",
        pillar(mode="failover", sse={"enabled": True, "cluster_id": "prod-east"}),
    ),
    "failover": (
        "master2",
        pillar(mode="failover", failover={"alive_interval": 10, "failback": True}),
    ),
    "failover-signing": (
        "master2",
        pillar(mode="failover", signing={"enabled": True, "public_key": SIGN_PUB}),
    ),
    "cluster": ("master2", pillar(mode="cluster", cluster=CLUSTER, masters=CLUSTER_MASTERS)),
    # Every other minion's pillar lacks the secret (targeted at the masters only).
    "cluster-plain-minion": (
        "web1",
        pillar(
            mode="cluster",
            masters=CLUSTER_MASTERS,
            cluster={k: v for k, v in CLUSTER.items() if k != "secret"},
        ),
    ),
    "ipc-tcp": ("master2", pillar(minion={"ipc_mode": "tcp", "tcp_pub_port": 4610})),
    "gitfs-acl": (
        "master2",
        pillar(
            master={
                "gitfs": {"remotes": ["https://git.example.com/salt/multimaster-formula.git"]},
                "acl": {"publisher_acl": {"deploy": [{"web*": ["test.ping"]}]}},
            }
        ),
    ),
    "unmanaged": ("master2", pillar(install_packages=False, manage_services=False)),
    "job-cache": ("master2", pillar(job_cache=JOB_CACHE)),
    # Every other minion's pillar lacks the password (targeted at the masters only).
    "job-cache-plain-minion": (
        "web1",
        pillar(job_cache={k: v for k, v in JOB_CACHE.items() if k != "password"}),
    ),
}


@pytest.fixture(scope="module")
def rendered(salt_env):
    """
    ``rendered(variant)``: its environment and ``{sls: high data or [errors]}`` for every SLS,
    rendered once per variant.
    """
    cache = {}

    def get(variant, table=VARIANTS):
        if variant not in cache:
            minion_id, data = table[variant]
            env = salt_env(minion_id, data)
            cache[variant] = env, env.render(SLS)
        return cache[variant]

    return get


def comparable(high):
    """
    High data without the ``order`` Salt numbers states with (it counts across renders).
    """
    return {
        sid: {
            key: [i for i in items if not (isinstance(i, dict) and "order" in i)]
            if isinstance(items, list)
            else items
            for key, items in body.items()
        }
        for sid, body in high.items()
    }


def states(rendered):
    assert isinstance(rendered, dict), f"render failed: {rendered}"
    return {sid: body for sid, body in rendered.items() if not sid.startswith("__")}


def args(body):
    """
    ``{"file": [{"name": ...}, {"dataset": ...}, "serialize", ...]}`` -> (fun, {arg: value}).
    """
    (module, items), *_ = ((k, v) for k, v in body.items() if not k.startswith("__"))
    fun = next(item for item in items if isinstance(item, str))
    kwargs = {}
    for item in items:
        if isinstance(item, dict):
            kwargs.update(item)
    return f"{module}.{fun}", kwargs


def test_every_sls_is_covered():
    assert REQUIRED_SLS <= set(SLS)


def test_the_first_highstate_sls_only_calls_the_claim(rendered):
    """
    With any pillar, or a bad one: one state, ``multimaster.claim_first_highstate`` through
    ``module.run``, which claims the mark and runs the highstate on the minion.
    """
    bad = {name: value[:2] for name, value in BAD.items()}
    for _, results in (rendered("example"), rendered("interval", bad)):
        found = states(results["multimaster.minion.first_highstate"])
        assert list(found) == ["multimaster-minion-first-highstate-module-run"], found
        fun, kwargs = args(found["multimaster-minion-first-highstate-module-run"])
        assert fun == "module.run" and kwargs["multimaster.claim_first_highstate"] == [], kwargs


@pytest.mark.parametrize("sls", SLS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sls_renders(rendered, variant, sls):
    _, results = rendered(variant)
    assert isinstance(results[sls], dict), f"{sls} failed to render: {results[sls]}"
    assert states(results[sls]), f"{sls} rendered no states"


def minion_dataset(env, results):
    fun, kwargs = args(
        states(results["multimaster.minion"])["multimaster-minion-config-file-managed"]
    )
    assert fun == "file.serialize"
    assert kwargs["name"] == str(env.conf_dir / "minion.d" / "multimaster.conf")
    return kwargs["dataset"]


def master_dataset(env, results):
    """
    The ``master.d`` options: no state argument (they may hold secrets), the state computes
    them when it runs; run here into a file of its own.
    """
    fun, kwargs = args(
        states(results["multimaster.master"])["multimaster-master-config-file-managed"]
    )
    assert fun == "multimaster.master_config_managed"
    assert kwargs["name"] == str(env.conf_dir / "master.d" / "multimaster.conf")
    assert kwargs["user"] == pwd.getpwuid(os.getuid()).pw_name
    path = env.base / "shown" / "multimaster.conf"
    with env.loaders() as loaders:
        ret = loaders.states.multimaster.master_config_managed(str(path))
    assert ret["result"] is True, ret
    return salt.utils.yaml.safe_load(path.read_text())


def set_dataset(env, results):
    """
    The ``master.d`` options that change with the set, computed as ``master_dataset``'s.
    """
    fun, kwargs = args(
        states(results["multimaster.master"])["multimaster-master-config-set-managed"]
    )
    assert fun == "multimaster.master_set_config_managed"
    assert kwargs["name"] == str(env.conf_dir / "master.d" / "multimaster-set.conf")
    path = env.base / "shown" / "multimaster-set.conf"
    with env.loaders() as loaders:
        ret = loaders.states.multimaster.master_set_config_managed(str(path))
    assert ret["result"] is True, ret
    return salt.utils.yaml.safe_load(path.read_text())


def test_pillar_example_outputs(rendered):
    env, results = rendered("example")
    minion = minion_dataset(env, results)
    assert minion["master"] == ["10.0.3.61", "10.0.3.230"]
    assert minion["master_type"] == "failover"
    assert minion["master_failback"] is True
    master = master_dataset(env, results)
    section = set_dataset(env, results)["multimaster"]
    assert section["mode"] == "failover"
    assert [m["id"] for m in section["masters"]] == ["master1", "master2"]
    assert master["publisher_acl"] == {"deploy": [{"web*": ["state.apply", "test.ping"]}]}
    assert "pam" in master["external_auth"]
    everything = states(results["multimaster"])
    # This Salt carries salt-master (pip): no second Salt from a package.
    assert "multimaster-master-package-install-pkg-present" in everything
    assert "multimaster-master-package-install-pkg-installed" not in everything
    # The minion applying multimaster.minion runs Salt already: it never installs salt-minion.
    assert not [sid for sid in everything if sid.startswith("multimaster-minion") and "pkg" in sid]
    assert not any(
        fun.startswith("pkg.") and "salt-minion" in str(kwargs)
        for fun, kwargs in map(args, everything.values())
    )


@pytest.mark.parametrize(("variant", "failover"), [("hot-sse", False), ("failover-sse", True)])
def test_sse_outputs(rendered, variant, failover):
    env, results = rendered(variant)
    master = master_dataset(env, results)
    assert master["sseapi_cluster_id"] == "prod-east"
    assert master["sseapi_failover_master"] is failover


def test_sse_options_only_when_asked(rendered):
    env, results = rendered("hot")
    assert not [key for key in master_dataset(env, results) if key.startswith("sseapi")]


def test_hot_outputs(rendered):
    env, results = rendered("hot")
    minion = minion_dataset(env, results)
    assert minion["master"] == ["127.0.0.2", "127.0.0.3"]
    assert minion["master_type"] == "str"
    assert "master_alive_interval" not in minion
    master = master_dataset(env, results)
    assert (master["publish_port"], master["ret_port"]) == (4505, 4506)
    assert "master_sign_pubkey" not in master
    master_states = states(results["multimaster.master"])
    fun, kwargs = args(master_states["multimaster-master-config-key-files-secure"])
    assert fun == "multimaster.master_key_files_secure"
    assert kwargs["pki_dir"] == str(env.master_pki)
    fun, kwargs = args(master_states["multimaster-master-service-running-master-restarted"])
    assert fun == "multimaster.master_restarted"
    # The pidfile is not a state argument: the module reads it from this master's own config.
    assert "pidfile" not in kwargs
    assert {"multimaster": "multimaster-master-config-file-managed"} in kwargs["onchanges"]
    minion_states = states(results["multimaster.minion"])
    fun, kwargs = args(minion_states["multimaster-minion-service-restarted"])
    assert fun == "multimaster.minion_restarted"
    assert kwargs["onchanges"] == [{"file": "multimaster-minion-config-file-managed"}]
    # The clean states remove exactly what was written.
    _, kwargs = args(
        states(results["multimaster.clean"])["multimaster-minion-clean-config-file-absent"]
    )
    assert kwargs["name"] == str(env.conf_dir / "minion.d" / "multimaster.conf")
    _, kwargs = args(
        states(results["multimaster.clean"])["multimaster-master-clean-config-file-absent"]
    )
    assert kwargs["name"] == str(env.conf_dir / "master.d" / "multimaster.conf")


def test_show_sls_agrees(rendered):
    # A later call on an environment, after others were made and used in between, renders as its
    # first did: environments do not share loaded modules or state.
    env, results = rendered("hot")
    rendered("hot-plain-minion")
    with env.loaders() as loaders:
        public = loaders.modules.state.show_sls("multimaster.minion")
    assert comparable(states(public)) == comparable(states(results["multimaster.minion"]))


def test_plain_minion_gets_no_master_states(rendered):
    env, results = rendered("hot-plain-minion")
    assert minion_dataset(env, results)["master"] == ["127.0.0.2", "127.0.0.3"]
    for sls in ("multimaster", "multimaster.clean"):
        assert not any(sid.startswith("multimaster-master-") for sid in states(results[sls]))
    # Asked for explicitly, multimaster.master fails with the reason instead of guessing.
    fun, kwargs = args(
        states(results["multimaster.master"])["multimaster-master-config-not-a-control-minion"]
    )
    assert fun == "test.fail_without_changes"
    assert "no entry has minion_id web1" in kwargs["name"]


def test_failover_outputs(rendered):
    env, results = rendered("failover")
    minion = minion_dataset(env, results)
    assert minion["master_type"] == "failover"
    assert minion["master_alive_interval"] == 10
    assert minion["master_failback"] is True
    assert "verify_master_pubkey_sign" not in minion
    minion_states = states(results["multimaster.minion"])
    assert "multimaster-minion-config-signing-pubkey-managed" not in minion_states


def test_failover_signing_outputs(rendered):
    env, results = rendered("failover-signing")
    assert minion_dataset(env, results)["verify_master_pubkey_sign"] is True
    assert master_dataset(env, results)["master_sign_pubkey"] is True
    minion_states = states(results["multimaster.minion"])
    fun, kwargs = args(minion_states["multimaster-minion-config-signing-pubkey-managed"])
    assert fun == "file.managed"
    assert kwargs["name"] == str(env.minion_pki / "master_sign.pub")
    assert kwargs["contents"] == SIGN_PUB
    _, kwargs = args(minion_states["multimaster-minion-service-restarted"])
    assert {"file": "multimaster-minion-config-signing-pubkey-managed"} in kwargs["onchanges"]
    clean = states(results["multimaster.minion.clean"])
    _, kwargs = args(clean["multimaster-minion-clean-signing-pubkey-absent"])
    assert kwargs["name"] == str(env.minion_pki / "master_sign.pub")


def test_cluster_outputs(rendered):
    env, results = rendered("cluster")
    minion = minion_dataset(env, results)
    # This minion controls a master: it talks to that master, never the balancer (127.0.0.10,
    # what every other minion gets: tests/unit/utils/test_multimaster_cluster.py).
    assert minion["master"] == ["127.0.0.3"]
    assert minion["master_type"] == "str"


def test_ipc_tcp_outputs(rendered):
    env, results = rendered("ipc-tcp")
    minion = minion_dataset(env, results)
    assert (minion["ipc_mode"], minion["tcp_pub_port"], minion["tcp_pull_port"]) == (
        "tcp",
        4610,
        4511,
    )


def test_gitfs_outputs(rendered):
    env, results = rendered("gitfs-acl")
    master = master_dataset(env, results)
    assert master["fileserver_backend"] == ["roots", "gitfs", "multimaster"]
    assert master["gitfs_provider"] == "pygit2"
    assert master["gitfs_remotes"] == ["https://git.example.com/salt/multimaster-formula.git"]
    assert master["publisher_acl"] == {"deploy": [{"web*": ["test.ping"]}]}
    # This suite's Salt is pip-installed: pygit2 goes into the Python running it.
    assert gitfs_dependency(results) == ("pip.installed", {"name": "pygit2"})


def gitfs_dependency(results):
    """
    ``(function, arguments)`` of the one state that installs gitfs' pygit2.
    """
    master_states = states(results["multimaster.master"])
    (body,) = (body for sid, body in master_states.items() if "gitfs" in sid)
    fun, kwargs = args(body)
    kwargs.pop("order", None)
    return fun, kwargs


def test_job_cache_outputs(rendered):
    """
    With the job cache on, a master gets psycopg2 (Salt's own pip here), the formula's returner
    in its extension_modules before its 0600 job cache file names it, and the schema check,
    and restarts when either changes. The password is no state argument: it appears nowhere
    in the rendered states (they are cached on the minion).
    """
    env, results = rendered("job-cache")
    master_states = states(results["multimaster.master"])
    fun, returner = args(master_states["multimaster-master-config-job-cache-returner-installed"])
    assert fun == "multimaster.job_cache_returner_installed"
    extmods = env.base / "cache" / "master" / "extmods"
    assert returner["name"] == str(extmods / "returners" / "multimaster_pgjsonb.py")
    assert returner["user"] == pwd.getpwuid(os.getuid()).pw_name
    fun, kwargs = args(master_states["multimaster-master-config-job-cache-managed"])
    assert fun == "multimaster.job_cache_config_managed"
    assert kwargs["name"] == str(env.conf_dir / "master.d" / "multimaster-job-cache.conf")
    assert {"multimaster": "multimaster-master-config-job-cache-returner-installed"} in kwargs[
        "require"
    ]
    fun, kwargs = args(master_states["multimaster-master-config-job-cache-schema-present"])
    assert (fun, kwargs["name"]) == (
        "multimaster.job_cache_schema_present",
        "salt@db.example.com:5432/salt",
    )
    fun, kwargs = args(master_states["multimaster-master-package-install-job-cache-pip-installed"])
    assert (fun, kwargs["name"]) == ("pip.installed", "psycopg2-binary")
    _, restart = args(master_states["multimaster-master-service-running-master-restarted"])
    for sid in ("job-cache-returner-installed", "job-cache-managed"):
        assert {"multimaster": f"multimaster-master-config-{sid}"} in restart["onchanges"]
    assert "master_job_cache" not in master_dataset(env, results)
    assert JOB_CACHE["password"] not in str(results)
    clean = states(results["multimaster.master.clean"])
    assert "multimaster-master-clean-job-cache-config-file-absent" in clean


def test_no_job_cache_states_unless_asked(rendered):
    _, results = rendered("hot")
    assert not [sid for sid in states(results["multimaster.master"]) if "job-cache" in sid]


def test_job_cache_with_a_distro_packaged_salt_installs_the_package(salt_env):
    data = pillar(job_cache=JOB_CACHE, lookup={"master": {"job_cache_install": "pkg"}})
    master_states = states(
        salt_env("master2", data).render(["multimaster.master"])["multimaster.master"]
    )
    fun, kwargs = args(master_states["multimaster-master-package-install-job-cache-pkg-installed"])
    assert (fun, kwargs["name"]) == ("pkg.installed", "python3-psycopg2")


@pytest.mark.parametrize("family", ["RedHat", "Suse"])
def test_os_family_parameters_name_the_distro_package(salt_env, family):
    data = pillar(job_cache=JOB_CACHE, lookup={"master": {"job_cache_install": "pkg"}})
    env = salt_env("master2", data, grains={"os_family": family})
    master_states = states(env.render(["multimaster.master"])["multimaster.master"])
    fun, kwargs = args(master_states["multimaster-master-package-install-job-cache-pkg-installed"])
    assert (fun, kwargs["name"]) == ("pkg.installed", "python3-psycopg2")


def test_a_family_without_parameters_fails_naming_the_package_key(salt_env):
    data = pillar(job_cache=JOB_CACHE, lookup={"master": {"job_cache_install": "pkg"}})
    env = salt_env("master2", data, grains={"os_family": "Gentoo"})
    errors = env.render(["multimaster.master"])["multimaster.master"]
    assert isinstance(errors, list)
    assert any("multimaster:lookup:master:job_cache_pkg" in e for e in errors), errors
    assert JOB_CACHE["password"] not in str(errors)


def test_gitfs_with_a_distro_packaged_salt_installs_the_package(salt_env):
    data = copy.deepcopy(VARIANTS["gitfs-acl"][1])
    data["lookup"] = {"master": {"gitfs_install": "pkg"}}
    env = salt_env("master2", data)
    assert gitfs_dependency(env.render(["multimaster.master"])) == (
        "pkg.installed",
        {"name": "python3-pygit2"},
    )


def test_unmanaged_outputs(rendered):
    _, results = rendered("unmanaged")
    everything = states(results["multimaster"])
    assert not any(args(body)[0] == "pkg.installed" for body in everything.values())
    restarts = {"multimaster.minion_restarted", "multimaster.master_restarted"}
    assert not any(args(body)[0] in restarts for body in everything.values())
    assert "multimaster-minion-service-unmanaged" in everything
    assert "multimaster-master-service-unmanaged" in everything


BAD = {
    "interval": (
        "master2",
        pillar(mode="failover", failover={"alive_interval": "30s"}),
        'multimaster:failover:alive_interval: got "30s"; expected an integer >= 1',
    ),
    "mode": ("master2", pillar(mode="active"), 'multimaster:mode: got "active"; expected one of'),
    "minion-id": (
        "master1",
        pillar(masters=[{"id": "master1", "host": "h1", "minion_id": "-rf"}]),
        "multimaster:masters[0]:minion_id: '-rf' is not a valid id",
    ),
}


@pytest.mark.parametrize("sls", [name for name in SLS if name not in PILLAR_FREE])
@pytest.mark.parametrize("bad", list(BAD))
def test_bad_pillar_fails_every_sls(rendered, bad, sls):
    _, results = rendered(bad, {k: v[:2] for k, v in BAD.items()})
    errors = results[sls]
    assert isinstance(errors, list), f"{sls} rendered despite a bad pillar: {errors}"
    assert any(BAD[bad][2] in error for error in errors), errors


def render_orch(env, name, **orch_pillar):
    """
    The high data of orchestration ``name`` on ``env``, ``orch_pillar`` given on the command
    line as ``state.orch`` takes it.
    """
    with env.loaders() as loaders:
        return loaders.modules.state.show_sls(f"multimaster.orch.{name}", pillar=orch_pillar)


# A pillar value that, pasted unquoted into YAML, ends the line and adds a state of its own.
CRAFTED = "master3\ninjected-state:\n  cmd.run:\n    - name: touch pwned"
REMOVE_ORCH_IDS = {
    "remove": ("hot", {"multimaster_remove": CRAFTED}),
    "remove-cluster": ("cluster", {"multimaster_remove": CRAFTED}),
    "minion-id": (
        "hot",
        {
            "multimaster_remove": "master3",
            "multimaster_remove_minion_id": CRAFTED,
            "multimaster_stop": True,
        },
    ),
    "balancer-minion": (
        "cluster",
        {"multimaster_remove": "127.0.0.4", "multimaster_balancer_minion": CRAFTED},
    ),
}


@pytest.mark.parametrize("case", list(REMOVE_ORCH_IDS))
def test_remove_master_refuses_an_id_that_is_not_one(rendered, case):
    variant, orch_pillar = REMOVE_ORCH_IDS[case]
    env, _ = rendered(variant)
    high = states(render_orch(env, "remove_master", **orch_pillar))
    assert list(high) == ["multimaster-orch-remove-master-pillar-refused"], high
    fun, kwargs = args(high["multimaster-orch-remove-master-pillar-refused"])
    assert fun == "test.fail_without_changes"
    (key,) = (k for k, v in orch_pillar.items() if v == CRAFTED)
    assert f"pillar {key}: {CRAFTED!r} is not a valid id; expected" in kwargs["name"], kwargs


@pytest.mark.parametrize(("variant", "gone"), [("hot", "master3"), ("cluster", "127.0.0.4")])
def test_remove_master_renders_its_steps_for_an_id(rendered, variant, gone):
    env, _ = rendered(variant)
    orch_pillar = {"multimaster_remove": gone, "multimaster_balancer_minion": "lb1"}
    high = states(render_orch(env, "remove_master", **orch_pillar))
    assert "multimaster-orch-remove-master-status" in high
    assert not [sid for sid in high if sid.endswith(("-refused", "-unknown"))], list(high)


def test_remove_master_restarts_the_cluster_masters_one_at_a_time(rendered):
    """
    Cluster masters that start together race their joins (one keeps an AES key of its own):
    each master's ``multimaster.master`` is a step of its own, after the previous one settled.
    """
    env, _ = rendered("cluster")
    orch_pillar = {"multimaster_remove": "127.0.0.4", "multimaster_balancer_minion": "lb1"}
    high = states(render_orch(env, "remove_master", **orch_pillar))
    prefix = "multimaster-orch-remove-master-masters-configured-"
    steps = [sid for sid in high if sid.startswith(prefix)]
    assert len(steps) >= 2, list(high)
    for sid in steps:
        _, kwargs = args(high[sid])
        assert len(kwargs["tgt"]) == 1, (sid, kwargs["tgt"])
    for earlier, later in itertools.pairwise(steps):
        settled = earlier.replace("-configured-", "-settled-")
        _, kwargs = args(high[later])
        assert {"salt": settled} in kwargs["require"], (later, kwargs["require"])
    # Its control minion talks to the removed master only: the stop waits for its return, and
    # the peers forget it only once a runner saw it stop listening and leave the Raft vote.
    _, stop = args(high["multimaster-orch-remove-master-stopped"])
    assert stop["kwarg"]["after_return"] is True
    _, confirmed = args(high["multimaster-orch-remove-master-stop-confirmed"])
    assert confirmed["name"] == "multimaster.wait_master_stopped"
    assert confirmed["host"] == "127.0.0.4"
    _, withdrawn = args(high["multimaster-orch-remove-master-vote-withdrawn"])
    assert withdrawn["name"] == "multimaster.wait_voter_removed"
    assert withdrawn["host"] == "127.0.0.4"
    assert {"salt": "multimaster-orch-remove-master-stop-confirmed"} in withdrawn["require"]
    _, forgotten = args(high["multimaster-orch-remove-master-peer-forgotten"])
    assert {"salt": "multimaster-orch-remove-master-vote-withdrawn"} in forgotten["require"]


# master1, the primary, is gone: pillar lists master2 and master3, at the next epoch.
PROMOTED = {
    "promoted": (
        "master2",
        pillar(masters=[MASTERS[1], {"id": "master3", "host": "127.0.0.4"}], epoch=2),
    ),
    "not-raised": ("master2", pillar(masters=[MASTERS[1], {"id": "master3", "host": "h3"}])),
    "raised-twice": ("master2", pillar(masters=[MASTERS[1]], epoch=3)),
    "elsewhere": (
        "master2",
        pillar(masters=[{"id": "master3", "host": "h3"}, MASTERS[1]], epoch=2),
    ),
}


def test_promote_renders_its_steps_minions_first(rendered):
    env, _ = rendered("promoted", PROMOTED)
    high = states(render_orch(env, "promote", multimaster_old_primary="master1"))
    steps = [sid.removeprefix("multimaster-orch-promote-") for sid in high]
    assert steps == [
        "minions-configured",
        "minions-settled",
        "masters-configured",
        "masters-settled",
        "keys-synced",
        "roots-synced",
        "status",
    ], steps
    _, masters = args(high["multimaster-orch-promote-masters-configured"])
    assert masters["tgt"] == ["master2", "master3"]
    # Until the masters' step, this master's section still lists the old primary.
    _, settled = args(high["multimaster-orch-promote-minions-settled"])
    assert settled["skip"] == "master1"


@pytest.mark.parametrize(
    "variant, old, refusal, says",
    [
        ("promoted", "master2", "refused", "no longer listed"),
        ("promoted", CRAFTED, "pillar-refused", "is not a valid id"),
        ("not-raised", "master1", "epoch-refused", "got 1; expected 2"),
        ("raised-twice", "master1", "epoch-refused", "got 3; expected 2"),
        ("elsewhere", "master1", "not-here", 'not the new primary "master3"'),
    ],
)
def test_promote_refuses_before_any_step(rendered, variant, old, refusal, says):
    env, _ = rendered(variant, PROMOTED)
    high = states(render_orch(env, "promote", multimaster_old_primary=old))
    assert list(high) == [f"multimaster-orch-promote-{refusal}"], list(high)
    fun, kwargs = args(high[f"multimaster-orch-promote-{refusal}"])
    assert fun == "test.fail_without_changes" and says in kwargs["name"], kwargs


@pytest.mark.parametrize(
    "name, orch_pillar",
    [
        ("add_master", {"multimaster_new": "master2"}),
        ("remove_master", {"multimaster_remove": "master3", "multimaster_stop": True}),
    ],
)
def test_orchestration_states_wait_for_a_state_run_already_on_the_minion(
    rendered, name, orch_pillar
):
    """
    A minion the orchestration restarts may get the first-highstate reactor's job at its start:
    the next ``salt.state`` step on it waits for that run instead of failing.
    """
    env, _ = rendered("hot")
    high = states(render_orch(env, name, **orch_pillar))
    steps = {sid: args(body) for sid, body in high.items() if "salt" in body}
    applied = {sid: kwargs for sid, (fun, kwargs) in steps.items() if fun == "salt.state"}
    assert applied, list(high)
    assert {sid: kwargs.get("queue") for sid, kwargs in applied.items()} == dict.fromkeys(
        applied, True
    )


def test_add_master_refuses_a_crafted_id_by_name(rendered):
    env, _ = rendered("hot")
    high = states(render_orch(env, "add_master", multimaster_new=CRAFTED))
    assert list(high) == ["multimaster-orch-add-master-refused"], high
    _, kwargs = args(high["multimaster-orch-add-master-refused"])
    assert f"got {json.dumps(CRAFTED)}; expected the id of a master listed" in kwargs["name"]
    assert '(["master1", "master2"])' in kwargs["name"], kwargs


def test_add_master_in_mode_cluster_refuses_without_a_leader_to_join_through(rendered):
    """
    The new master joins through the Raft leader ``cluster.members`` names; where it names none
    (here: no cluster state at all), nothing runs, and the message says what to do.
    """
    env, _ = rendered("cluster")
    orch_pillar = {"multimaster_new": "127.0.0.3", "multimaster_balancer_minion": "lb1"}
    high = states(render_orch(env, "add_master", **orch_pillar))
    assert list(high) == ["multimaster-orch-add-master-no-leader"], list(high)
    _, kwargs = args(high["multimaster-orch-add-master-no-leader"])
    # The runner raised here: its traceback stays out of the message.
    assert kwargs["name"].startswith("cluster.members failed on this master (its log has why)")
    assert "Traceback" not in kwargs["name"], kwargs
    assert "salt-run multimaster.cluster_ready" in kwargs["name"], kwargs


@pytest.mark.parametrize(
    "orch_pillar, says",
    [
        ({"multimaster_new": "127.0.0.3"}, "pillar multimaster_balancer_minion: got null"),
        (
            {"multimaster_new": "127.0.0.3", "multimaster_balancer_minion": CRAFTED},
            "pillar multimaster_balancer_minion: ",
        ),
        (
            {"multimaster_new": "127.0.0.9", "multimaster_balancer_minion": "lb1"},
            'pillar multimaster_new: got "127.0.0.9"; expected the id of a master listed',
        ),
    ],
    ids=["no balancer", "crafted balancer", "unlisted"],
)
def test_add_master_in_mode_cluster_refuses_bad_pillar_by_name(rendered, orch_pillar, says):
    env, _ = rendered("cluster")
    high = states(render_orch(env, "add_master", **orch_pillar))
    assert len(high) == 1 and list(high)[0].startswith("multimaster-orch-add-master-"), high
    _, kwargs = args(next(iter(high.values())))
    assert says in kwargs["name"], kwargs


def test_remove_master_of_a_dead_host_leaves_its_control_minion_out(rendered):
    env, _ = rendered("hot")
    orch_pillar = {"multimaster_remove": "master3", "multimaster_remove_unreachable": True}
    high = states(render_orch(env, "remove_master", **orch_pillar))
    _, minions = args(high["multimaster-orch-remove-master-minions-configured"])
    assert minions["tgt"] == "* and not L@master3" and minions["tgt_type"] == "compound"
    assert "multimaster-orch-remove-master-status" in high
    # Alive (the default): every minion, the removed master's control minion too.
    high = states(render_orch(env, "remove_master", multimaster_remove="master3"))
    _, minions = args(high["multimaster-orch-remove-master-minions-configured"])
    assert minions["tgt"] == "*" and "tgt_type" not in minions


@pytest.mark.parametrize(
    "orch_pillar",
    [
        {"multimaster_remove_unreachable": True, "multimaster_stop": True},
        {"multimaster_remove_unreachable": "yes"},
    ],
)
def test_remove_master_of_a_dead_host_refuses_a_stop_or_a_non_boolean(rendered, orch_pillar):
    env, _ = rendered("hot")
    high = states(render_orch(env, "remove_master", multimaster_remove="master3", **orch_pillar))
    assert list(high) == ["multimaster-orch-remove-master-unreachable-refused"], high
    _, kwargs = args(high["multimaster-orch-remove-master-unreachable-refused"])
    assert "multimaster_remove_unreachable" in kwargs["name"], kwargs

"""
The good path of ``multimaster_settings``: merging over the defaults, and the master and minion
configuration each mode implies.
"""

import copy
import json
import pathlib
import socket

import multimaster_pillarcheck
import multimaster_settings as ms
import pytest

from tests.support.keyfactory import pub_pem, rsa_private

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]

PEM = pub_pem(rsa_private(tag=30))
# Salt's cluster names a peer by its id and dials it by the same string.
CLUSTER_MASTERS = [{"id": h, "host": h} for h in ("10.0.3.61", "10.0.3.230")]


def build(defaults, **pillar):
    pillar.setdefault(
        "masters",
        [{"id": "master1", "host": "10.0.3.61"}, {"id": "master2", "host": "10.0.3.230"}],
    )
    return ms.build(pillar, defaults)


def test_merge_over_defaults_keeps_what_pillar_does_not_set(defaults):
    settings = build(defaults, ports={"publish": 5505}, minion={"retry_dns": 5})
    assert settings["mode"] == "hot"
    assert settings["ports"] == {"publish": 5505, "ret": 4506}
    assert settings["minion"]["retry_dns"] == 5
    assert settings["minion"]["master_tries"] == defaults["minion"]["master_tries"]
    assert settings["failover"] == defaults["failover"]
    assert settings["lookup"] == defaults["lookup"]
    assert settings["install_packages"] is True
    assert settings["manage_services"] is True


def test_build_changes_neither_pillar_nor_defaults(defaults):
    pillar = {"mode": "hot", "masters": [{"id": "master1", "host": "h1"}], "ports": {"ret": 5506}}
    pillar_before, defaults_before = copy.deepcopy(pillar), copy.deepcopy(defaults)
    settings = ms.build(pillar, defaults)
    settings["masters"][0]["host"] = "changed"
    settings["ports"]["publish"] = 1
    assert pillar == pillar_before
    assert defaults == defaults_before


def test_lookup_is_overridable_from_pillar(defaults):
    settings = build(
        defaults, lookup={"config_file": "zz-multimaster.conf", "master": {"service": "master"}}
    )
    assert settings["lookup"]["config_file"] == "zz-multimaster.conf"
    # Merged key by key: the package names stay.
    assert settings["lookup"]["master"] == {**defaults["lookup"]["master"], "service": "master"}
    assert settings["lookup"]["minion"] == defaults["lookup"]["minion"]


def test_minion_id_defaults_to_the_master_id(defaults):
    settings = build(
        defaults,
        masters=[
            {"id": "master1", "host": "10.0.3.61"},
            {"id": "master2", "host": "10.0.3.230", "minion_id": "ctl2"},
        ],
    )
    assert [m["minion_id"] for m in settings["masters"]] == ["master1", "ctl2"]
    assert ms.primary(settings)["id"] == "master1"
    assert ms.find_master(settings, "ctl2")["id"] == "master2"
    assert ms.find_master(settings, "master2") is None


def test_hot_configs(defaults):
    settings = build(defaults)
    minion = ms.minion_config(settings)
    assert minion == {
        "master": ["10.0.3.61", "10.0.3.230"],
        "master_port": 4506,
        "publish_port": 4505,
        "master_type": "str",
        "retry_dns": 30,
        "master_tries": 1,
    }
    master = ms.master_config(settings, settings["masters"][1])
    assert (master["publish_port"], master["ret_port"]) == (4505, 4506)
    # What pillar does not set stays the master's own (master.d replaces a key it sets).
    assert not {"interface", "file_roots", "pillar_roots"} & set(master)
    # The section the runners read is in the file that changes without a restart.
    assert "multimaster" not in master and "peer_run" not in master
    section = ms.set_config(settings)["multimaster"]
    assert section == ms.runner_section(settings)
    assert {"mode", "ports", "masters", "manage_services"} <= set(section)
    assert not {"master", "minion", "lookup", "install_packages"} & set(section)
    assert section["mode"] == "hot"
    assert [m["minion_id"] for m in section["masters"]] == ["master1", "master2"]
    for key in ("master_sign_pubkey", "gitfs_remotes", "gitfs_provider"):
        assert key not in master
    # The file server serves roots, and last the formula's transfers (sync_roots' content).
    assert master["fileserver_backend"] == ["roots", "multimaster"]


def test_reactors_are_rendered_only_when_pillar_asks(defaults):
    """
    No ``reactor`` option by default; each switch adds its own tag and SLS.
    """
    master = build(defaults)["masters"][0]
    assert "reactor" not in ms.master_config(build(defaults), master)
    keys = build(defaults, reactor={"keys": True})
    assert ms.master_config(keys, master)["reactor"] == [
        {"salt/key": ["salt://multimaster/reactor/keys.sls"]}
    ]
    both = build(defaults, reactor={"keys": True, "first_highstate": True})
    assert ms.master_config(both, master)["reactor"] == [
        {"salt/key": ["salt://multimaster/reactor/keys.sls"]},
        {"salt/minion/*/start": ["salt://multimaster/reactor/first_highstate.sls"]},
    ]
    for _, sls in multimaster_pillarcheck.REACTORS.values():
        assert (REPO_ROOT / sls.removeprefix("salt://")).is_file(), sls


def test_per_master_interface_wins(defaults):
    settings = build(
        defaults,
        masters=[
            {"id": "m1", "host": "127.0.0.2", "interface": "127.0.0.2"},
            {"id": "m2", "host": "h"},
        ],
        master={"interface": "127.0.0.1"},
    )
    assert ms.master_config(settings, settings["masters"][0])["interface"] == "127.0.0.2"
    assert ms.master_config(settings, settings["masters"][1])["interface"] == "127.0.0.1"


def test_only_what_pillar_sets_replaces_the_masters_own(defaults):
    """
    A master whose own config serves roots and gitfs from its ``master`` file keeps them: the
    formula extends its backends and ``peer_run`` instead of writing Salt's defaults over them.
    """
    own = {
        "fileserver_backend": ["gitfs", "roots"],
        "peer_run": {"^ops$": ["^jobs\\."]},
        "file_roots": {"base": ["/srv/formulas/site"]},
        "interface": "10.0.3.61",
    }
    settings = build(defaults)
    master = ms.master_config(settings, settings["masters"][0], own)
    assert not {"interface", "file_roots", "pillar_roots"} & set(master)
    assert master["fileserver_backend"] == ["gitfs", "roots", "multimaster"]
    assert master["peer_run"] == {"^ops$": ["^jobs\\."]}
    assert ms.set_config(settings)["peer_run"] == {
        "^(master1|master2)$": ["^multimaster_transfer\\.pull$"]
    }
    chosen = build(defaults, master={"interface": "10.0.3.9", "fileserver_backend": ["roots"]})
    master = ms.master_config(chosen, chosen["masters"][0], own)
    assert master["interface"] == "10.0.3.9"
    assert master["fileserver_backend"] == ["roots", "multimaster"]


@pytest.mark.parametrize(
    ("mode", "roots_watch", "runs"),
    [("hot", None, True), ("failover", None, True), ("hot", False, False)],
)
def test_the_roots_watch_engine_runs_unless_turned_off(defaults, mode, roots_watch, runs):
    """
    Every master of a hot or failover set runs the roots watch engine, synced before the
    restart that loads it, unless ``master:roots_watch`` is false.
    """
    master = {} if roots_watch is None else {"roots_watch": roots_watch}
    settings = build(defaults, mode=mode, master=master)
    config = ms.master_config(settings, settings["masters"][0])
    assert ("engines" in config) is runs
    if runs:
        assert config["engines"] == [{"multimaster_rootswatch": {}}]
    assert ms.syncs_master_modules(settings) is runs


def test_the_master_s_own_engines_stay_beside_the_roots_watch(defaults):
    """
    Salt takes a ``master.d`` list over the ``master`` file's: the master's own engines (list
    or mapping form) are rendered beside the roots watch, which comes once.
    """
    settings = build(defaults)
    master = settings["masters"][0]
    own = {"engines": ["pytest", {"slack": {"token": "t"}}, {"multimaster_rootswatch": {}}]}
    assert ms.master_config(settings, master, own)["engines"] == [
        "pytest",
        {"slack": {"token": "t"}},
        {"multimaster_rootswatch": {}},
    ]
    mapping = {"engines": {"reactor_tail": {"interval": 5}}}
    assert ms.master_config(settings, master, mapping)["engines"] == [
        {"reactor_tail": {"interval": 5}},
        {"multimaster_rootswatch": {}},
    ]


def test_the_master_s_own_reactors_stay_beside_the_formula_s(defaults):
    """
    A ``master.d`` ``reactor`` list replaces the ``master`` file's: the master's own reactors
    are rendered first, the formula's after them, each once.
    """
    settings = build(defaults, reactor={"keys": True})
    master = settings["masters"][0]
    ours = ms.reactor_config(settings)
    shop = {"salt/auth": ["/srv/reactor/auth.sls"]}
    config = ms.master_config(settings, master, {"reactor": [shop, *ours]})
    assert config["reactor"] == [shop, *ours]
    assert ms.master_config(settings, master, {"reactor": "not a list"})["reactor"] == ours
    assert ms.master_config(settings, master)["reactor"] == ours


def test_a_cluster_runs_no_roots_watch(defaults):
    """A cluster's masters take no ``sync_roots``: no engine to keep a record for it."""
    settings = cluster_settings(defaults)
    assert "engines" not in ms.master_config(settings, settings["masters"][0])
    assert ms.watches_roots(settings) is False


def test_per_master_roots_win(defaults):
    """
    Masters on one host need their own roots: a master's ``file_roots``/``pillar_roots`` win
    over ``master:`` for that master only.
    """
    own = {"base": ["/srv/m2/salt"]}
    settings = build(
        defaults,
        masters=[{"id": "m1", "host": "a"}, {"id": "m2", "host": "b", "file_roots": own}],
        master={"file_roots": {"base": ["/srv/salt"]}},
    )
    first, second = (ms.master_config(settings, m) for m in settings["masters"])
    assert first["file_roots"] == {"base": ["/srv/salt"]} and second["file_roots"] == own
    assert "pillar_roots" not in first and "pillar_roots" not in second


def test_failover_configs(defaults):
    settings = build(
        defaults,
        mode="failover",
        failover={"alive_interval": 10, "failback": True, "shuffle": True},
    )
    minion = ms.minion_config(settings)
    assert minion["master_type"] == "failover"
    assert minion["master"] == ["10.0.3.61", "10.0.3.230"]
    assert minion["master_alive_interval"] == 10
    assert minion["master_failback"] is True
    assert minion["master_failback_interval"] == 30
    assert minion["random_master"] is True
    assert minion["random_reauth_delay"] == 60
    assert "verify_master_pubkey_sign" not in minion
    master = ms.master_config(settings, settings["masters"][0])
    assert "master_sign_pubkey" not in master
    assert ms.set_config(settings)["multimaster"]["failover"]["alive_interval"] == 10


def test_a_failover_control_minion_always_fails_back_to_the_primary(defaults):
    settings = build(defaults, mode="failover", failover={"failback": False})
    assert ms.minion_config(settings)["master_failback"] is False
    control = ms.minion_config(settings, settings["masters"][1])
    assert control["master_failback"] is True and control["master"] == ["10.0.3.61", "10.0.3.230"]


def test_failover_with_signing_configs(defaults):
    settings = build(defaults, mode="failover", signing={"enabled": True, "public_key": PEM})
    assert ms.minion_config(settings)["verify_master_pubkey_sign"] is True
    master = ms.master_config(settings, settings["masters"][0])
    assert master["master_sign_pubkey"] is True
    assert ms.set_config(settings)["multimaster"]["signing"] == {"enabled": True, "public_key": PEM}


def test_hot_with_signing_signs_and_verifies_the_shared_key(defaults):
    settings = build(defaults, mode="hot", signing={"enabled": True, "public_key": PEM})
    minion = ms.minion_config(settings)
    assert minion["verify_master_pubkey_sign"] is True and minion["master_type"] == "str"
    master = ms.master_config(settings, settings["masters"][0])
    assert master["master_sign_pubkey"] is True
    assert ms.set_config(settings)["multimaster"]["signing"] == {"enabled": True, "public_key": PEM}


def test_hot_without_signing_neither_signs_nor_verifies(defaults):
    settings = build(defaults, mode="hot")
    assert "verify_master_pubkey_sign" not in ms.minion_config(settings)
    master = ms.master_config(settings, settings["masters"][0])
    assert "master_sign_pubkey" not in master
    assert "signing" not in ms.set_config(settings)["multimaster"]


def cluster_settings(defaults):
    return build(
        defaults,
        mode="cluster",
        masters=CLUSTER_MASTERS,
        cluster={"id": "c1", "balancer": "lb.example.com"},
    )


def test_cluster_minions_know_only_the_balancer(defaults):
    settings = cluster_settings(defaults)
    minion = ms.minion_config(settings)
    assert minion["master"] == ["lb.example.com"]
    assert minion["master_type"] == "str"
    assert "master_alive_interval" not in minion


def test_ipc_mode_tcp(defaults):
    settings = build(defaults, minion={"ipc_mode": "tcp", "tcp_pub_port": 4600})
    minion = ms.minion_config(settings)
    assert (minion["ipc_mode"], minion["tcp_pub_port"], minion["tcp_pull_port"]) == (
        "tcp",
        4600,
        4511,
    )


def test_ipc_mode_ipc_writes_no_tcp_ports(defaults):
    minion = ms.minion_config(build(defaults))
    assert not {"ipc_mode", "tcp_pub_port", "tcp_pull_port"} & set(minion)


def test_gitfs_remotes(defaults):
    remotes = ["https://git.example.com/salt/multimaster-formula.git"]
    settings = build(defaults, master={"gitfs": {"remotes": remotes}})
    master = ms.master_config(settings, settings["masters"][0])
    assert master["fileserver_backend"] == ["roots", "gitfs", "multimaster"]
    assert master["gitfs_provider"] == "pygit2"
    assert master["gitfs_remotes"] == remotes


def test_fileserver_backends_come_from_pillar_in_order_once(defaults):
    settings = build(
        defaults, master={"fileserver_backend": ["gitfs", "roots"], "gitfs": {"remotes": ["x"]}}
    )
    master = ms.master_config(settings, settings["masters"][0])
    assert master["fileserver_backend"] == ["gitfs", "roots", "multimaster"]


@pytest.mark.parametrize("backends", [[], "roots", ["roots", ""], ["roots", 3], None])
def test_a_bad_fileserver_backend_list_is_refused_by_name(defaults, backends):
    with pytest.raises(multimaster_pillarcheck.SettingsError, match="master:fileserver_backend"):
        build(defaults, master={"fileserver_backend": backends})


def test_acl_is_passed_through_identically_to_every_master(defaults):
    acl = {
        "publisher_acl": {"deploy": [{"web*": ["state.apply"]}]},
        "external_auth": {"pam": {"saltadm%": [".*", "@runner"]}},
    }
    settings = build(defaults, master={"acl": copy.deepcopy(acl)})
    configs = [ms.master_config(settings, master) for master in settings["masters"]]
    for config in configs:
        assert config["publisher_acl"] == acl["publisher_acl"]
        assert config["external_auth"] == acl["external_auth"]
    assert configs[0] == configs[1]


def test_config_passthrough_is_applied_last(defaults):
    settings = build(defaults, master={"config": {"worker_threads": 3, "interface": "127.0.0.9"}})
    master = ms.master_config(settings, settings["masters"][0])
    assert master["worker_threads"] == 3
    assert master["interface"] == "127.0.0.9"


@pytest.mark.parametrize("mode", ["hot", "failover", "cluster"])
def test_every_mode_builds_with_minimal_pillar(defaults, mode):
    extra = (
        {"cluster": {"id": "c1", "balancer": "lb"}, "masters": CLUSTER_MASTERS}
        if mode == "cluster"
        else {}
    )
    settings = build(defaults, mode=mode, **extra)
    assert settings["mode"] == mode
    assert ms.minion_config(settings)["master"]
    assert ms.set_config(settings)["multimaster"]["mode"] == mode


def test_redacted_settings_mask_secrets_but_keep_the_shape(defaults):
    settings = build(
        defaults,
        master={
            "config": {"ext_pillar_password": "hunter2", "worker_threads": 9},
            "gitfs": {"remotes": ["https://deploy:s3cret@git.example.com/f.git"]},
        },
    )
    master = settings["masters"][0]
    settings["config"] = {"master": ms.master_config(settings, master)}
    shown = ms.redacted_settings(settings)
    text = json.dumps(shown)
    assert "hunter2" not in text and "s3cret" not in text
    assert shown["master"]["config"] == {
        "ext_pillar_password": multimaster_pillarcheck.MASK,
        "worker_threads": multimaster_pillarcheck.MASK,
    }
    assert shown["config"]["master"]["ext_pillar_password"] == multimaster_pillarcheck.MASK
    assert shown["master"]["gitfs"]["remotes"] == [
        f"https://{multimaster_pillarcheck.MASK}@git.example.com/f.git"
    ]
    assert shown["masters"] == settings["masters"]
    # The settings themselves are untouched: templates still render the real values.
    assert settings["master"]["config"]["ext_pillar_password"] == "hunter2"


def fake_resolver(known):
    """
    A ``getaddrinfo`` that knows ``known`` (name -> families it has addresses in) and IP
    addresses, and records the family each lookup asked for.
    """
    asked = []

    def getaddrinfo(host, port, family, kind):
        asked.append(family)
        if host.replace(".", "").isdigit():
            return [(socket.AF_INET, kind, 6, "", (host, 0))]
        families = known.get(host, ())
        if family in families or (family == socket.AF_UNSPEC and families):
            return [(families[0], kind, 6, "", (host, 0))]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    getaddrinfo.asked = asked
    return getaddrinfo


def test_unresolvable_names_each_name_the_minion_cannot_resolve_in_order():
    resolver = fake_resolver({"master2.example.com": (socket.AF_INET,)})
    hosts = ["10.0.3.61", "nope.invalid", "master2.example.com", "also.invalid"]
    assert ms.unresolvable(hosts, getaddrinfo=resolver) == ["nope.invalid", "also.invalid"]
    assert ms.unresolvable(["10.0.3.61", "master2.example.com"], getaddrinfo=resolver) == []


def test_unresolvable_asks_for_ipv4_only_when_the_minion_turns_ipv6_off():
    resolver = fake_resolver({"v6only.example.com": (socket.AF_INET6,)})
    assert ms.unresolvable(["v6only.example.com"], ipv6=False, getaddrinfo=resolver) == [
        "v6only.example.com"
    ]
    assert ms.unresolvable(["v6only.example.com"], ipv6=None, getaddrinfo=resolver) == []
    assert resolver.asked == [socket.AF_INET, socket.AF_UNSPEC]


@pytest.mark.parametrize("mode", ["hot", "failover"])
def test_minions_list_the_reserved_slots_after_the_masters(defaults, mode):
    minion = ms.minion_config(build(defaults, mode=mode, reserved=["10.0.3.232", "10.0.3.233"]))
    assert minion["master"] == ["10.0.3.61", "10.0.3.230", "10.0.3.232", "10.0.3.233"]


def test_a_master_added_into_a_reserved_slot_leaves_the_minions_list_as_it_was(defaults):
    reserved = ["10.0.3.232", "10.0.3.233"]
    before = ms.minion_config(build(defaults, reserved=reserved))
    masters = [
        {"id": "master1", "host": "10.0.3.61"},
        {"id": "master2", "host": "10.0.3.230"},
        {"id": "master4", "host": "10.0.3.233"},
    ]
    after = ms.minion_config(build(defaults, reserved=reserved, masters=masters))
    assert after == before
    # The slot keeps its place even when pillar lists that master first.
    first = ms.minion_config(build(defaults, reserved=reserved, masters=[masters[2], *masters[:2]]))
    assert first["master"] == before["master"]

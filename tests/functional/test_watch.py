"""
The restart states under a real ``watch:`` requisite: Salt calls ``mod_watch`` with the whole low
chunk (``__reqs__``, ``__id__``, ...) as keyword arguments; the state must take what it needs and
restart (here: report that no daemon runs) instead of failing with a TypeError.
"""

from .test_apply import SETTINGS, failed, results
from .test_render import pillar

SLS = """
watched-file:
  file.managed:
    - name: {path}
    - contents: {contents}

minion-restarted-on-watch:
  multimaster.minion_restarted:
    - watch:
      - file: watched-file

master-restarted-on-watch:
  multimaster.master_restarted:
    - watch:
      - file: watched-file
"""


def test_restart_states_under_watch(salt_env, tmp_path):
    env = salt_env("master2", pillar(mode="hot", **SETTINGS))
    sls = SLS.format(path=tmp_path / "watched", contents="one")
    with env.loaders() as loaders:
        ret = loaders.modules.state.template_str(sls)
    assert not failed(ret), ret
    states = results(ret)
    assert states["watched-file"]["changes"], ret
    for sid in ("minion-restarted-on-watch", "master-restarted-on-watch"):
        assert states[sid]["result"] is True, states[sid]
        assert "not restarted" in states[sid]["comment"], states[sid]
        assert "no running daemon" in states[sid]["comment"], states[sid]

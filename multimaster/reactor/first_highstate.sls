# -*- coding: utf-8 -*-
# vim: ft=sls
{#- Reactor for `salt/minion/<id>/start` (rendered into master.d by multimaster.master when
    pillar multimaster:reactor:first_highstate is true). Every master the minion connects to
    reacts; the minion itself claims the one highstate atomically, so it runs once for the set.
    `data.id` is NOT authenticated: any accepted minion can fire this tag (a pretagged minion
    event) with any id in its data, so it is only a hint and must match the tag. The runner
    reacts only to an id accepted in this master's store, once per id and key in a window,
    and waits on nothing; the minion claims only just after its own salt-minion started. #}
{%- set minion = data.get("id") %}
{%- if minion is string and tag == "salt/minion/" ~ minion ~ "/start" %}

multimaster-reactor-first-highstate-runner-first-highstate:
  runner.multimaster.first_highstate:
    - args:
      - minion: {{ minion | json }}
{%- endif %}

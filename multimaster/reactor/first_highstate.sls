# -*- coding: utf-8 -*-
# vim: ft=sls
{#- Reactor for `salt/minion/<id>/start` (rendered into master.d by multimaster.master when
    pillar multimaster:reactor:first_highstate is true). Every master the minion connects to
    reacts; the minion itself claims the one highstate atomically, so it runs once for the set.
    The id is the authenticated sender's (`data.id`), and must match the tag. #}
{%- set minion = data.get("id") %}
{%- if minion is string and tag == "salt/minion/" ~ minion ~ "/start" %}

multimaster-reactor-first-highstate-runner-first-highstate:
  runner.multimaster.first_highstate:
    - args:
      - minion: {{ minion | json }}
{%- endif %}

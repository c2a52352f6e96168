# -*- coding: utf-8 -*-
# vim: ft=sls
{#- Reactor for `salt/key` (rendered into master.d by multimaster.master when pillar
    multimaster:reactor:keys is true). Any accepted minion can put a `salt/key` event on a
    master's bus (a pretagged minion event), so the event is only a hint: the runner reads this
    master's own key store and propagates only what it finds there. #}
{%- set acts = {"accept": "accept", "accepted": "accept",
                "reject": "reject", "rejected": "reject", "delete": "delete"} %}
{%- set act = acts.get(data.get("act")) if data.get("act") is string else None %}
{%- set minion = data.get("id") %}
{%- if act and minion is string %}

multimaster-reactor-keys-runner-key-event:
  runner.multimaster.key_event:
    - args:
      - minion: {{ minion | json }}
      - act: {{ act }}
{%- endif %}

# -*- coding: utf-8 -*-
# vim: ft=sls
{#- Reactor for `salt/key` (rendered into master.d by multimaster.master when pillar
    multimaster:reactor:keys is true). Any accepted minion can put a `salt/key` event on a
    master's bus (a pretagged minion event) with any id in it, so the event is only a hint: the
    runner reads this master's own key store and propagates only what it finds there (a delete
    only for an id this master held before), once per change in a window. In a cluster, an
    event a peer forwarded (`__peer_id`) was the peer's to propagate, and one the runner fired
    to replay a change to the peers (`multimaster_replayed`) is not reacted to again: nothing
    loops. #}
{#- A reaction that cannot run says so in this master's log, at error level. #}
{%- set runners = opts.extension_modules ~ "/runners/multimaster.py" %}
{%- if not salt["file.file_exists"](runners) %}
{%-   do salt["log.error"]("multimaster: the key reactor cannot run: " ~ runners
        ~ " is missing; run salt-run saltutil.sync_all on this master, then restart it") %}
{%- endif %}
{#- salt/key acts (3008: accepted/rejected; 3006/3007: accept/reject) -> what key_event takes #}
{%- set acts = {"accept": "accept", "accepted": "accept",
                "reject": "reject", "rejected": "reject", "delete": "delete"} %}
{%- set act = acts.get(data.get("act")) if data.get("act") is string else None %}
{%- set minion = data.get("id") %}
{%- set relayed = data.get("__peer_id") or data.get("multimaster_replayed") %}
{%- if act and minion is string and not relayed %}

multimaster-reactor-keys-runner-key-event:
  runner.multimaster.key_event:
    - args:
      - minion: {{ minion | json }}
      - act: {{ act }}
{%- endif %}

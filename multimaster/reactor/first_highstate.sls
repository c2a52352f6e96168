# -*- coding: utf-8 -*-
# vim: ft=sls
{#- Reactor for `salt/minion/<id>/start` (rendered into master.d by multimaster.master when
    pillar multimaster:reactor:first_highstate is true). Every master the minion connects to
    reacts; the minion itself claims the one highstate atomically, so it runs once for the set.
    `data.id` is NOT authenticated: any accepted minion can fire this tag (a pretagged minion
    event) with any id in its data, so it is only a hint and must match the tag. The runner
    reacts only to an id accepted in this master's store, once per id and key in a window,
    and waits on nothing; the minion claims only just after its own salt-minion started. #}
{#- A reaction that cannot run says so in this master's log, at error level. #}
{%- set runners = opts.extension_modules ~ "/runners/multimaster.py" %}
{%- if not salt["file.file_exists"](runners) %}
{%-   do salt["log.error"]("multimaster: the first-highstate reactor cannot run: " ~ runners
        ~ " is missing; run salt-run saltutil.sync_all on this master, then restart it") %}
{%- endif %}
{%- set minion = data.get("id") %}
{%- if minion is string and tag == "salt/minion/" ~ minion ~ "/start" %}

multimaster-reactor-first-highstate-runner-first-highstate:
  runner.multimaster.first_highstate:
    - args:
      - minion: {{ minion | json }}
{%- endif %}

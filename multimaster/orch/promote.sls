# -*- coding: utf-8 -*-
# vim: ft=sls
{#- salt-run state.orch multimaster.orch.promote pillar='{"multimaster_old_primary": "master1"}'
    The primary's host is gone for good: another master becomes the authority for minion keys,
    roots and the master key. In pillar first: take the old primary out of multimaster:masters
    (the next master becomes the primary; multimaster:primary names another) and raise
    multimaster:epoch by one. Run on the new primary. The survivors' sections get the new
    primary and epoch (from then on a returning old primary is fenced: its runners refuse to act
    and its orders are refused), the minions drop the old primary (batched), keys and roots
    converge on the new primary, and status reports the survivors. Safe to re-run. #}
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set old = pillar.get("multimaster_old_primary") %}
{%- set old_minion = pillar.get("multimaster_old_primary_minion_id", old) %}
{%- set batch = pillar.get("multimaster_batch", "10%") %}
{%- set ids = mapdata.masters | map(attribute="id") | list %}
{%- set remaining = mapdata.masters | map(attribute="minion_id") | list %}
{%- set on_disk = opts.get("multimaster") or {} %}
{%- set current = on_disk.get("epoch", 1) %}
{%- set here = opts.get("id", "") %}
{%- set problems = salt["multimaster.id_problems"]({
      "pillar multimaster_old_primary": old,
      "pillar multimaster_old_primary_minion_id": pillar.get("multimaster_old_primary_minion_id"),
    }) %}

{%- if problems %}

multimaster-orch-promote-pillar-refused:
  test.fail_without_changes:
    - name: {{ problems | join("; ") | json }}
    - failhard: true
{%- elif not old or old in ids %}

multimaster-orch-promote-refused:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_old_primary: got {{ old | json }}; expected the id of the old
        primary, no longer listed in multimaster:masters ({{ ids | json }}): remove it from
        pillar first
    - failhard: true
{%- elif mapdata.mode == "cluster" %}

multimaster-orch-promote-cluster-refused:
  test.fail_without_changes:
    - name: >-
        mode cluster: the masters share their keys through the cluster, and promote is not
        built for it; take the dead master out with multimaster.orch.remove_master
    - failhard: true
{%- elif here not in [mapdata.primary, mapdata.primary ~ "_master"] %}

multimaster-orch-promote-not-here:
  test.fail_without_changes:
    - name: >-
        this master is {{ here | json }}, not the new primary {{ mapdata.primary | json }}:
        run the promotion on it
    - failhard: true
{%- elif mapdata.epoch != current + 1
      and not (mapdata.epoch == current and on_disk.get("primary") == mapdata.primary) %}

multimaster-orch-promote-epoch-refused:
  test.fail_without_changes:
    - name: >-
        pillar multimaster:epoch: got {{ mapdata.epoch | json }}; expected {{ current + 1 }}
        (this master's section is at epoch {{ current }}: raise it by one for the promotion)
    - failhard: true
{%- else %}

{#- Minions first: a Salt 3008 hot minion that still lists the dead master can stop for good
    when a live master it lists restarts (its dead master's connection takes the reconnect
    event of the live one). The old primary's control minion died with it: a batch would
    wait for it and fail. #}
multimaster-orch-promote-minions-configured:
  salt.state:
    - tgt: {{ ("* and not L@" ~ old_minion) | json }}
    - tgt_type: compound
    - sls: multimaster.minion
    - batch: {{ batch | json }}
    - queue: true
    - failhard: true

{#- The control minions restart after their multimaster.minion job returned; this master's
    section still lists the old primary until the next step. #}
multimaster-orch-promote-minions-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - skip: {{ old | json }}
    - failhard: true
    - require:
      - salt: multimaster-orch-promote-minions-configured

{#- Each survivor's section names the new primary and epoch: its set file, which restarts no
    master (a master restarts only where more changed, once no minion still runs the job). #}
multimaster-orch-promote-masters-configured:
  salt.state:
    - tgt: {{ remaining | json }}
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-promote-minions-settled

multimaster-orch-promote-masters-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-promote-masters-configured

multimaster-orch-promote-keys-synced:
  salt.runner:
    - name: multimaster.sync_keys
    - failhard: true
    - require:
      - salt: multimaster-orch-promote-masters-settled

multimaster-orch-promote-roots-synced:
  salt.runner:
    - name: multimaster.sync_roots
    - failhard: true
    - require:
      - salt: multimaster-orch-promote-keys-synced

multimaster-orch-promote-status:
  salt.runner:
    - name: multimaster.status
    - failhard: true
    - require:
      - salt: multimaster-orch-promote-roots-synced
{%- endif %}

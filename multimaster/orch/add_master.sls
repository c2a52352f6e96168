# -*- coding: utf-8 -*-
# vim: ft=sls
{#- salt-run state.orch multimaster.orch.add_master pillar='{"multimaster_new": "master3"}'
    Brings in a master already listed in pillar multimaster:masters whose control minion is
    accepted on the primary. Run on the primary. Stops at the first failure; safe to re-run.
    The primary's multimaster.master comes before the key sync (not after it, with the other
    masters): the master key is sealed only to recipients in the primary's own config, and the
    new control minion pulls transfers through the primary's peer_run. #}
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set new_id = pillar.get("multimaster_new") %}
{%- set batch = pillar.get("multimaster_batch", "10%") %}
{%- set primary = mapdata.masters | selectattr("id", "equalto", mapdata.primary) | first %}
{%- set found = mapdata.masters | selectattr("id", "equalto", new_id) | list %}
{%- set others = mapdata.masters | rejectattr("id", "in", [primary.id, new_id]) | list %}

{%- if not found or new_id == primary.id %}

multimaster-orch-add-master-refused:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_new: got {{ new_id | json }}; expected the id of a master listed in
        multimaster:masters ({{ mapdata.masters | map(attribute="id") | list | json }}), not the
        primary
    - failhard: true
{%- else %}
{%-   set new = found[0] %}

{#- A control minion accepted moments ago signs in again only after its acceptance wait. #}
multimaster-orch-add-master-new-control-minion-answers:
  salt.runner:
    - name: multimaster.wait_minions
    - tgt: {{ new.minion_id | json }}
    - timeout: 120
    - failhard: true

multimaster-orch-add-master-modules-synced:
  salt.function:
    - name: saltutil.sync_all
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-control-minion-answers

multimaster-orch-add-master-new-master-configured:
  salt.state:
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-modules-synced

multimaster-orch-add-master-primary-configured:
  salt.state:
    - tgt: [{{ primary.minion_id | json }}]
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-configured

multimaster-orch-add-master-masters-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-primary-configured
{%-   for step in ("sync_master_key", "sync_roots", "sync_keys") %}

multimaster-orch-add-master-{{ step | replace("_", "-") }}:
  salt.runner:
    - name: multimaster.{{ step }}
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-masters-settled
{%-   endfor %}

{#- Its reactors call the formula's runners: they come with its roots, and load at a restart. #}
multimaster-orch-add-master-new-master-modules-synced:
  salt.function:
    - name: multimaster_daemons.sync_master_modules
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-sync-roots
{%-   if others %}

multimaster-orch-add-master-other-masters-configured:
  salt.state:
    - tgt: {{ others | map(attribute="minion_id") | list | json }}
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-sync-keys
{%-   endif %}

{#- multimaster.master (the other masters) and sync_master_modules (the new one) restart masters
    after their jobs returned: a minion applying its state meanwhile would fetch files from a
    master going down. #}
multimaster-orch-add-master-masters-settled-before-minions:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-modules-synced
      - salt: multimaster-orch-add-master-{{ "other-masters-configured" if others else "sync-keys" }}

multimaster-orch-add-master-minions-configured:
  salt.state:
    - tgt: '*'
    - sls: multimaster.minion
    - batch: {{ batch | json }}
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-masters-settled-before-minions

multimaster-orch-add-master-masters-settled-again:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-minions-configured

multimaster-orch-add-master-status:
  salt.runner:
    - name: multimaster.status
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-masters-settled-again
{%- endif %}

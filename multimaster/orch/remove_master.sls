# -*- coding: utf-8 -*-
# vim: ft=sls
{#- salt-run state.orch multimaster.orch.remove_master pillar='{"multimaster_remove": "master3"}'
    For a master already taken out of pillar multimaster:masters. Run on the primary. Minions
    first (they drop it from their master list), then the remaining masters' multimaster
    section, then, with multimaster_stop: true, its control minion stops it
    (multimaster_remove_minion_id, default the master's id; multimaster_remove_config_dir,
    default that minion's own config dir). Stops at the first failure; safe to re-run. #}
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set gone = pillar.get("multimaster_remove") %}
{%- set gone_minion = pillar.get("multimaster_remove_minion_id", gone) %}
{%- set batch = pillar.get("multimaster_batch", "10%") %}
{%- set ids = mapdata.masters | map(attribute="id") | list %}

{%- if not gone or gone in ids %}

multimaster-orch-remove-master-refused:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_remove: got {{ gone | json }}; expected the id of a master no longer
        listed in multimaster:masters ({{ ids | join(", ") }}): remove it from pillar first
    - failhard: true
{%- else %}

multimaster-orch-remove-master-minions-configured:
  salt.state:
    - tgt: '*'
    - sls: multimaster.minion
    - batch: {{ batch | json }}
    - failhard: true

{#- The control minions restart after their multimaster.minion job returned; the removed
    master's own no longer finds itself in pillar. #}
multimaster-orch-remove-master-minions-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - skip: [{{ gone | json }}]
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-minions-configured

multimaster-orch-remove-master-masters-configured:
  salt.state:
    - tgt: {{ mapdata.masters | map(attribute="minion_id") | list | json }}
    - tgt_type: list
    - sls: multimaster.master
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-minions-settled

multimaster-orch-remove-master-masters-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-masters-configured
{%-   if pillar.get("multimaster_stop", false) %}

multimaster-orch-remove-master-stopped:
  salt.function:
    - name: multimaster.stop_master
    - tgt: [{{ gone_minion | json }}]
    - tgt_type: list
    - kwarg:
        config_dir: {{ pillar.get("multimaster_remove_config_dir") | json }}
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-masters-settled
{%-   endif %}

multimaster-orch-remove-master-status:
  salt.runner:
    - name: multimaster.status
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-masters-settled
{%- endif %}

# -*- coding: utf-8 -*-
# vim: ft=sls
{#- salt-run state.orch multimaster.orch.remove_master pillar='{"multimaster_remove": "master3"}'
    For a master already taken out of pillar multimaster:masters. Run on the primary. Minions
    first (they drop it from their master list), then the remaining masters' multimaster
    section, then, with multimaster_stop: true, its control minion stops it
    (multimaster_remove_minion_id, default the master's id; multimaster_remove_config_dir,
    default that minion's own config dir). Stops at the first failure; safe to re-run.
    With multimaster_remove_unreachable: true (its host is dead) the minions' step leaves out
    its control minion, which could not answer, and multimaster_stop is refused.

    Mode cluster (minions know only the balancer): multimaster.haproxy on the balancer's minion
    (multimaster_balancer_minion) drains it, its control minion stops it (always: a removed peer
    left running keeps talking to the cluster), the Raft leader demotes it to a learner,
    every remaining master deletes its
    peers/<address>.pub, then multimaster.master restarts them without it (and with the new
    multimaster:cluster:secret: multimaster_rotate_secret: true refuses to go on while pillar
    still holds the secret the removed master knows). multimaster_remove is its cluster address. #}
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set gone = pillar.get("multimaster_remove") %}
{%- set gone_minion = pillar.get("multimaster_remove_minion_id", gone) %}
{%- set batch = pillar.get("multimaster_batch", "10%") %}
{%- set unreachable = pillar.get("multimaster_remove_unreachable", false) %}
{%- set ids = mapdata.masters | map(attribute="id") | list %}
{%- set cluster = mapdata.mode == "cluster" %}
{%- set balancer_minion = pillar.get("multimaster_balancer_minion") %}
{%- set remaining = mapdata.masters | map(attribute="minion_id") | list %}
{#- Every value below is quoted (| json); the ids are checked first, so that a crafted value is
    refused by name rather than passed on as a target. #}
{%- set problems = salt["multimaster.id_problems"]({
      "pillar multimaster_remove": gone,
      "pillar multimaster_remove_minion_id": pillar.get("multimaster_remove_minion_id"),
      "pillar multimaster_balancer_minion": balancer_minion,
    }) %}

{%- if problems %}

multimaster-orch-remove-master-pillar-refused:
  test.fail_without_changes:
    - name: {{ problems | join("; ") | json }}
    - failhard: true
{%- elif not gone or gone in ids %}

multimaster-orch-remove-master-refused:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_remove: got {{ gone | json }}; expected the id of a master no longer
        listed in multimaster:masters ({{ ids | json }}): remove it from pillar first
    - failhard: true
{%- elif unreachable not in [true, false] or (unreachable and pillar.get("multimaster_stop", false)) %}

multimaster-orch-remove-master-unreachable-refused:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_remove_unreachable: got {{ unreachable | json }} with multimaster_stop
        {{ pillar.get("multimaster_stop", false) | json }}; expected true (the host is dead, so
        nothing can stop it) or false, and never true together with multimaster_stop: true
    - failhard: true
{%- elif cluster and not balancer_minion %}

multimaster-orch-remove-master-balancer-unknown:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_balancer_minion: got {{ balancer_minion | json }}; expected the minion
        id of the HAProxy host of the cluster, where multimaster.haproxy drains {{ gone | json }}
    - failhard: true
{%- elif cluster %}

multimaster-orch-remove-master-drained:
  salt.state:
    - tgt: [{{ balancer_minion | json }}]
    - tgt_type: list
    - sls: multimaster.haproxy
    - queue: true
    - failhard: true

{#- Execution functions read the pillar a minion holds in memory: the new section and secret. #}
multimaster-orch-remove-master-pillar-refreshed:
  salt.function:
    - name: saltutil.refresh_pillar
    - tgt: {{ remaining | json }}
    - tgt_type: list
    - kwarg:
        wait: true
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-drained

{#- Every check before the removed master is touched: the secret rotation asked for, the
    peer not listed. The balancer is drained first: pillar no longer lists the master. #}
multimaster-orch-remove-master-peer-checked:
  salt.function:
    - name: multimaster.forget_cluster_peer
    - tgt: {{ remaining | json }}
    - tgt_type: list
    - arg: [{{ gone | json }}]
    - kwarg:
        rotate_secret: {{ pillar.get("multimaster_rotate_secret", false) | json }}
        test: true
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-pillar-refreshed

{#- A cluster master's control minion talks to that master only: it could not return after
    stopping it, so the stop comes once its job has returned, and a runner confirms it. #}
multimaster-orch-remove-master-stopped:
  salt.function:
    - name: multimaster_daemons.stop_master
    - tgt: [{{ gone_minion | json }}]
    - tgt_type: list
    - kwarg:
        config_dir: {{ pillar.get("multimaster_remove_config_dir") | json }}
        after_return: true
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-peer-checked

multimaster-orch-remove-master-stop-confirmed:
  salt.runner:
    - name: multimaster.wait_master_stopped
    - host: {{ gone | json }}
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-stopped

{#- Salt has no command that takes a member out of the Raft vote: the leader demotes it, now
    silent, to a learner (cluster_auto_replace_voters). A removed voter would count in every
    majority, and the remaining masters would lose their quorum while one of them restarts. #}
multimaster-orch-remove-master-vote-withdrawn:
  salt.runner:
    - name: multimaster.wait_voter_removed
    - host: {{ gone | json }}
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-stop-confirmed

multimaster-orch-remove-master-peer-forgotten:
  salt.function:
    - name: multimaster.forget_cluster_peer
    - tgt: {{ remaining | json }}
    - tgt_type: list
    - arg: [{{ gone | json }}]
    - kwarg:
        rotate_secret: {{ pillar.get("multimaster_rotate_secret", false) | json }}
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-vote-withdrawn

{#- Each master restarts once its control minion's job has returned, one at a time, each
    settled before the next: masters of a cluster that start together race their joins (a
    peer refuses a join whose token another start replaced, and that master keeps an AES key
    of its own). The master running this orchestration goes last, so that it never restarts
    while it waits for a return. #}
{%-   set ns = namespace(last="multimaster-orch-remove-master-peer-forgotten") %}
{%-   for step, targets in salt["multimaster.cluster_restart_order"]() %}

multimaster-orch-remove-master-masters-configured-{{ step }}:
  salt.state:
    - tgt: {{ targets | json }}
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
    - failhard: true
    - require:
      - salt: {{ ns.last }}

{#- The runners read the section from this master's config: until the last step it still
    lists the removed master. #}
multimaster-orch-remove-master-masters-settled-{{ step }}:
  salt.runner:
    - name: multimaster.wait_masters
    - skip: [{{ gone | json }}]
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-masters-configured-{{ step }}
{%-     set ns.last = "multimaster-orch-remove-master-masters-settled-" ~ step %}
{%-   endfor %}

multimaster-orch-remove-master-status:
  salt.runner:
    - name: multimaster.status
    - failhard: true
    - require:
      - salt: {{ ns.last }}
{%- else %}

{#- A dead host's control minion cannot answer: a batch would wait for it and fail. #}
multimaster-orch-remove-master-minions-configured:
  salt.state:
{%-   if unreachable %}
    - tgt: {{ ("* and not L@" ~ gone_minion) | json }}
    - tgt_type: compound
{%-   else %}
    - tgt: '*'
{%-   endif %}
    - sls: multimaster.minion
    - batch: {{ batch | json }}
    - queue: true
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
    - tgt: {{ remaining | json }}
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
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
    - name: multimaster_daemons.stop_master
    - tgt: [{{ gone_minion | json }}]
    - tgt_type: list
    - kwarg:
        config_dir: {{ pillar.get("multimaster_remove_config_dir") | json }}
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-masters-settled
{%-   endif %}

{#- The pillar that dropped the master changed on the primary: the others serve it too. #}
multimaster-orch-remove-master-roots-synced:
  salt.runner:
    - name: multimaster.sync_roots
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-masters-settled

multimaster-orch-remove-master-status:
  salt.runner:
    - name: multimaster.status
    - failhard: true
    - require:
      - salt: multimaster-orch-remove-master-roots-synced
{%- endif %}

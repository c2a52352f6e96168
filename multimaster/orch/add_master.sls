# -*- coding: utf-8 -*-
# vim: ft=sls
{#- salt-run state.orch multimaster.orch.add_master pillar='{"multimaster_new": "master3"}'
    Brings in a master already listed in pillar multimaster:masters whose control minion is
    accepted on the primary. Run on the primary. Stops at the first failure; safe to re-run.
    The primary's multimaster.master comes first (not with the other masters): the master key
    is sealed only to recipients in the primary's own config. Only its set file changes, which
    restarts no master (the new control minion pulls through the primary's file server, which
    needs no peer_run entry for it). The key sync comes next, so that a new master that does
    not run yet first starts serving the set's key.

    Mode cluster (run on any master; multimaster_balancer_minion names the HAProxy host's
    minion; the new control minion is accepted and answers, connected to any master): the new
    master starts with the Raft leader as its one peer and joins; the other masters gain it in
    their peer lists, one at a time, this one last; share_peer_keys gives it the keys Salt did
    not; it restarts with every peer and its control minion moves to it; cluster_ready; the
    balancer adds it; the minions answer; status. #}
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set new_id = pillar.get("multimaster_new") %}
{%- set batch = pillar.get("multimaster_batch", "10%") %}
{%- set primary = mapdata.masters | selectattr("id", "equalto", mapdata.primary) | first %}
{%- set found = mapdata.masters | selectattr("id", "equalto", new_id) | list %}
{%- set others = mapdata.masters | rejectattr("id", "in", [primary.id, new_id]) | list %}

{%- set cluster = mapdata.mode == "cluster" %}
{%- set balancer_minion = pillar.get("multimaster_balancer_minion") %}
{#- multimaster_new is checked against the ids pillar lists, the balancer's minion here. #}
{%- set problems = salt["multimaster.id_problems"]({
      "pillar multimaster_balancer_minion": balancer_minion,
    }) %}

{%- if problems %}

multimaster-orch-add-master-pillar-refused:
  test.fail_without_changes:
    - name: {{ problems | join("; ") | json }}
    - failhard: true
{%- elif not found or (new_id == primary.id and not cluster) %}

multimaster-orch-add-master-refused:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_new: got {{ new_id | json }}; expected the id of a master listed in
        multimaster:masters ({{ mapdata.masters | map(attribute="id") | list | json }}), not the
        primary
    - failhard: true
{%- elif cluster and not balancer_minion %}

multimaster-orch-add-master-balancer-unknown:
  test.fail_without_changes:
    - name: >-
        pillar multimaster_balancer_minion: got {{ balancer_minion | json }}; expected the minion
        id of the HAProxy host of the cluster, where multimaster.haproxy adds {{ new_id | json }}
    - failhard: true
{%- elif cluster %}
{%-   set new = found[0] %}
{%-   set join = salt["multimaster.cluster_join_plan"](new_id) %}
{%-   if join.problem %}

multimaster-orch-add-master-no-leader:
  test.fail_without_changes:
    - name: >-
        {{ join.problem }}: the new master joins through the leader; run
        salt-run multimaster.cluster_ready, then again
    - failhard: true
{%-   else %}

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
{%-     set ns = namespace(last="multimaster-orch-add-master-modules-synced") %}
{%-     if not join.joined %}
{%-       set join_pillar = dict(multimaster=dict(masters=join.masters)) %}

multimaster-orch-add-master-new-master-joins:
  salt.state:
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - sls: multimaster.cluster
    - pillar: {{ join_pillar | json }}
    - queue: true
    - failhard: true
    - require:
      - salt: {{ ns.last }}

multimaster-orch-add-master-new-master-member:
  salt.runner:
    - name: multimaster.wait_cluster_member
    - host: {{ new_id | json }}
    - timeout: 180
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-joins
{%-       set ns.last = "multimaster-orch-add-master-new-master-member" %}
{%-     endif %}

{#- Their peer lists gain it: each restarts once its job has returned, one at a time. #}
{%-     for step, targets in salt["multimaster.cluster_restart_order"]([new_id]) %}

multimaster-orch-add-master-masters-configured-{{ step }}:
  salt.state:
    - tgt: {{ targets | json }}
    - tgt_type: list
    - sls: multimaster.cluster
    - queue: true
    - failhard: true
    - require:
      - salt: {{ ns.last }}

multimaster-orch-add-master-masters-settled-{{ step }}:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-masters-configured-{{ step }}
{%-       set ns.last = "multimaster-orch-add-master-masters-settled-" ~ step %}
{%-     endfor %}

{#- A joiner holds only the public key of the peer it joined through. #}
multimaster-orch-add-master-peer-keys-shared:
  salt.runner:
    - name: multimaster.share_peer_keys
    - masters: {{ new_id | json }}
    - failhard: true
    - require:
      - salt: {{ ns.last }}

{#- Every peer in its list now, and its control minion moves to it (a cluster master's runners
    reach it through its control minion, and only it holds that minion's session key). #}
multimaster-orch-add-master-new-master-configured:
  salt.state:
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - sls: [multimaster.cluster, multimaster.minion]
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-peer-keys-shared

multimaster-orch-add-master-new-master-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-configured

multimaster-orch-add-master-cluster-ready:
  salt.runner:
    - name: multimaster.cluster_ready
    - timeout: 180
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-settled

multimaster-orch-add-master-balancer-configured:
  salt.state:
    - tgt: [{{ balancer_minion | json }}]
    - tgt_type: list
    - sls: multimaster.haproxy
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-cluster-ready

{#- The balancer's source hash now sends some minions' requests to the new master, which holds
    no session of theirs: each signs in again there at its next request. #}
multimaster-orch-add-master-minions-answer:
  salt.runner:
    - name: multimaster.wait_minions
    - timeout: 180
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-balancer-configured

multimaster-orch-add-master-status:
  salt.runner:
    - name: multimaster.status
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-minions-answer
{%-   endif %}
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

multimaster-orch-add-master-primary-configured:
  salt.state:
    - tgt: [{{ primary.minion_id | json }}]
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-modules-synced

{#- The new master may not run yet: it is started below, once it has what it serves. #}
multimaster-orch-add-master-masters-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - skip: {{ new_id | json }}
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-primary-configured

{#- First: a new master that does not run yet keeps the set's key from its first start (a
    package install starts it in the next step), so a minion listing its address never meets
    a key of its own. One bootstrapped running restarts with the set's key. #}
multimaster-orch-add-master-sync-master-key:
  salt.runner:
    - name: multimaster.sync_master_key
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-masters-settled

multimaster-orch-add-master-new-master-configured:
  salt.state:
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - sls: multimaster.master
    - queue: true
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-sync-master-key

multimaster-orch-add-master-sync-roots:
  salt.runner:
    - name: multimaster.sync_roots
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-configured

{#- Its reactors call the formula's runners: they come with its roots, and load at a start. #}
multimaster-orch-add-master-new-master-modules-synced:
  salt.function:
    - name: multimaster_daemons.sync_master_modules
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-sync-roots

{#- Its first start, unless a package install started it: the set's key, its roots and runners
    in place. The minion keys follow: sync_keys leaves a master that does not run untouched
    (minions signing in meanwhile wait as pending there, and retry). #}
multimaster-orch-add-master-new-master-started:
  salt.function:
    - name: multimaster_daemons.start_master
    - tgt: [{{ new.minion_id | json }}]
    - tgt_type: list
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-modules-synced

multimaster-orch-add-master-new-master-settled:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-started

multimaster-orch-add-master-sync-keys:
  salt.runner:
    - name: multimaster.sync_keys
    - failhard: true
    - require:
      - salt: multimaster-orch-add-master-new-master-settled
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

{#- multimaster.master restarts the other masters after its job returned, where more than the
    set changed: a minion applying its state meanwhile would fetch files from a master going
    down. #}
multimaster-orch-add-master-masters-settled-before-minions:
  salt.runner:
    - name: multimaster.wait_masters
    - failhard: true
    - require:
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

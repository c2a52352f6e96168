# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set master = mapdata.local.master %}

{%- if master %}
{%-   if mapdata.mode == "cluster" %}

include:
  - {{ tplroot }}.cluster.config
{%-   endif %}

{#- master:config and gitfs remotes may hold secrets: the state computes the options at run
    time (no state argument, no diff) into a 0600 file the master's user owns. #}
multimaster-master-config-file-managed:
  multimaster.master_config_managed:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.config_file }}
    - user: {{ master.user }}

{#- What changes with the set (the multimaster: section, the pull's peer_run): no restart
    watches it, the runners read it from disk. #}
multimaster-master-config-set-managed:
  multimaster.master_set_config_managed:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.set_config_file }}
    - user: {{ master.user }}

{%-   if mapdata.job_cache.enabled %}

{#- The master loads its master_job_cache from its own extension_modules: the returner is
    there before the options name it (a master lacking it could not publish). #}
multimaster-master-config-job-cache-returner-installed:
  multimaster.job_cache_returner_installed:
    - name: {{ master.extension_modules }}/returners/{{ mapdata.job_cache.returner }}.py
    - user: {{ master.user }}

{#- The database password lives in this 0600 file only (computed at run time, no diff). #}
multimaster-master-config-job-cache-managed:
  multimaster.job_cache_config_managed:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.job_cache_config_file }}
    - user: {{ master.user }}
    - require:
      - multimaster: multimaster-master-config-job-cache-returner-installed
{%-     if mapdata.job_cache.create_schema %}

multimaster-master-config-job-cache-schema-present:
  multimaster.job_cache_schema_present:
    - name: {{ mapdata.job_cache.user }}@{{ mapdata.job_cache.host }}:{{ mapdata.job_cache.port }}/{{ mapdata.job_cache.db }}
    - require:
      - multimaster: multimaster-master-config-job-cache-managed
{%-     endif %}
{%-   endif %}

{%-   if mapdata.syncs_master_modules %}

{#- The reactors call the formula's runners, and the roots watch is an engine: in place before
    the restart below. #}
multimaster-master-config-runners-synced:
  multimaster.master_runners_synced:
    - name: {{ master.id | json }}
{%-   endif %}

multimaster-master-config-key-files-secure:
  multimaster.master_key_files_secure:
    - pki_dir: {{ master.pki_dir }}
    - user: {{ master.user }}
{%- else %}

multimaster-master-config-not-a-control-minion:
  test.fail_without_changes:
    - name: >-
        multimaster:masters: no entry has minion_id {{ grains.id }};
        apply multimaster.master only on the control minion of a listed master
{%- endif %}

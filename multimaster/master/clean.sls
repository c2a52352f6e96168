# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set master = mapdata.local.master %}

{%- if master %}

multimaster-master-clean-config-file-absent:
  file.absent:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.config_file }}

multimaster-master-clean-set-config-file-absent:
  file.absent:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.set_config_file }}

{#- Whatever the mode now: a master that left a cluster keeps no cluster options. #}
multimaster-master-clean-cluster-config-file-absent:
  file.absent:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.cluster_config_file }}

{#- Whatever the pillar says now: a cleaned master keeps no database password. #}
multimaster-master-clean-job-cache-config-file-absent:
  file.absent:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.job_cache_config_file }}
{%-   if mapdata.manage_services %}

multimaster-master-clean-master-restarted:
  multimaster.master_restarted:
    - service: {{ mapdata.lookup.master.service }}
    - onchanges:
      - file: multimaster-master-clean-config-file-absent
      - file: multimaster-master-clean-set-config-file-absent
      - file: multimaster-master-clean-cluster-config-file-absent
      - file: multimaster-master-clean-job-cache-config-file-absent
{%-   endif %}
{%- else %}

multimaster-master-clean-nothing-to-do:
  test.nop:
    - name: this minion controls no listed master
{%- endif %}

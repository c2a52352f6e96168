# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set master = mapdata.local.master %}

{%- if mapdata.mode != "cluster" %}

multimaster-cluster-config-mode-not-cluster:
  test.fail_without_changes:
    - name: >-
        multimaster:mode is {{ mapdata.mode }}; the cluster options are rendered only with
        mode cluster
{%- elif master %}

{#- cluster_secret lives in this 0600 file only: the state computes the options at run time,
    so the secret is no state argument (those are cached in highstate.cache.p), and no diff. #}
multimaster-cluster-config-file-managed:
  multimaster.cluster_config_managed:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.cluster_config_file }}
    - user: {{ master.user }}
{%- else %}

multimaster-cluster-config-not-a-control-minion:
  test.fail_without_changes:
    - name: >-
        multimaster:masters: no entry has minion_id {{ grains.id }};
        apply multimaster.cluster only on the control minion of a listed master
{%- endif %}

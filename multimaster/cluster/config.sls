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

{#- cluster_secret lives here: mode 0600, no diff in the job return, never an argument. #}
multimaster-cluster-config-file-managed:
  file.serialize:
    - name: {{ master.config_dir }}/master.d/{{ mapdata.lookup.cluster_config_file }}
    - dataset: {{ mapdata.config.cluster | json }}
    - serializer: yaml
    - mode: '0600'
    - makedirs: true
    - show_changes: false
{%- else %}

multimaster-cluster-config-not-a-control-minion:
  test.fail_without_changes:
    - name: >-
        multimaster:masters: no entry has minion_id {{ grains.id }};
        apply multimaster.cluster only on the control minion of a listed master
{%- endif %}

# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set local = mapdata.local %}

multimaster-minion-clean-config-file-absent:
  file.absent:
    - name: {{ local.minion_conf_dir }}/minion.d/{{ mapdata.lookup.config_file }}

multimaster-minion-clean-first-highstate-mark-absent:
  file.absent:
    - name: {{ local.first_highstate_mark }}
{%- set signing = mapdata.mode != "cluster" and mapdata.signing.enabled %}
{%- if signing %}

multimaster-minion-clean-signing-pubkey-absent:
  file.absent:
    - name: {{ local.minion_pki_dir }}/master_sign.pub
{%- endif %}
{%- if mapdata.manage_services %}

multimaster-minion-clean-service-restarted:
  multimaster.minion_restarted:
    - service: {{ mapdata.lookup.minion.service }}
    - onchanges:
      - file: multimaster-minion-clean-config-file-absent
{%-   if signing %}
      - file: multimaster-minion-clean-signing-pubkey-absent
{%-   endif %}
{%- endif %}

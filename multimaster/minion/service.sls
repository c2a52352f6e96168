# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}

include:
  - .config

{%- if mapdata.manage_services %}

{#- Restarts after this job has returned: a highstate that changes the master list still reports. #}
multimaster-minion-service-restarted:
  multimaster.minion_restarted:
    - service: {{ mapdata.lookup.minion.service }}
    - onchanges:
      - file: multimaster-minion-config-file-managed
{%-   if mapdata.mode != "cluster" and mapdata.signing.enabled %}
      - file: multimaster-minion-config-signing-pubkey-managed
{%-   endif %}
{%- else %}

multimaster-minion-service-unmanaged:
  test.nop:
    - name: manage_services is false; restart salt-minion yourself after config changes
{%- endif %}

# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set master = mapdata.local.master %}

include:
  - .config

{%- if mapdata.manage_services and master %}
{%-   if mapdata.install_packages and not mapdata.local.salt_master_installed %}

{#- Installed from packages here: a system service, kept enabled and running. #}
multimaster-master-service-running-service-running:
  service.running:
    - name: {{ mapdata.lookup.master.service }}
    - enable: true
{%-   endif %}

{#- After this job returns, so a master never drops the return of the job that reconfigured it. #}
multimaster-master-service-running-master-restarted:
  multimaster.master_restarted:
    - service: {{ mapdata.lookup.master.service }}
    - onchanges:
      - multimaster: multimaster-master-config-file-managed
{%-   if mapdata.mode == "cluster" %}
      - multimaster: multimaster-cluster-config-file-managed
{%-   endif %}
{%-   if mapdata.job_cache.enabled %}
      - multimaster: multimaster-master-config-job-cache-returner-installed
      - multimaster: multimaster-master-config-job-cache-managed
{%-   endif %}
{%-   if mapdata.syncs_master_modules %}
      - multimaster: multimaster-master-config-runners-synced
{%-   endif %}
{%- else %}

multimaster-master-service-unmanaged:
  test.nop:
    - name: manage_services is false; restart salt-master yourself after config changes
{%- endif %}

# -*- coding: utf-8 -*-
# vim: ft=sls
{#- The TCP balancer in front of a master cluster (mode cluster), on the host applying it. #}
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set haproxy = mapdata.cluster.haproxy %}

{%- if mapdata.mode != "cluster" %}

multimaster-haproxy-mode-not-cluster:
  test.fail_without_changes:
    - name: >-
        multimaster:mode is {{ mapdata.mode }}; the balancer is only for mode cluster
{%- else %}
{%-   if mapdata.install_packages %}

multimaster-haproxy-package-installed:
  pkg.installed:
    - name: {{ mapdata.lookup.haproxy.pkg }}
    - require_in:
      - multimaster: multimaster-haproxy-config-managed
{%-   endif %}

{#- Checked with haproxy -c before it replaces the live file: a bad pillar never breaks a
    running balancer. #}
multimaster-haproxy-config-managed:
  multimaster.haproxy_configured:
    - name: {{ haproxy.config_file }}
{%-   if mapdata.manage_services and haproxy.pidfile %}

{#- A plain process (labs, containers): started, or reloaded gracefully with -sf. #}
multimaster-haproxy-running:
  multimaster.haproxy_running:
    - name: {{ haproxy.config_file }}
    - pidfile: {{ haproxy.pidfile }}
    - watch:
      - multimaster: multimaster-haproxy-config-managed
{%-   elif mapdata.manage_services %}

multimaster-haproxy-running:
  service.running:
    - name: {{ mapdata.lookup.haproxy.service }}
    - enable: true
    - reload: true
    - watch:
      - multimaster: multimaster-haproxy-config-managed
{%-   endif %}
{%- endif %}

# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}
{%- set local = mapdata.local %}
{#- No package state: the minion applying this is installed already, and on a onedir or pip
    install a distribution salt-minion package would be a second, conflicting Salt. #}
{#- Before anything is written: a name the minion cannot resolve would cut it off from all. #}
{%- do salt["multimaster.check_resolves"](mapdata.config.minion.master) %}

multimaster-minion-config-file-managed:
  file.serialize:
    - name: {{ local.minion_conf_dir }}/minion.d/{{ mapdata.lookup.config_file }}
    - dataset: {{ mapdata.config.minion | json }}
    - serializer: yaml
    - mode: '0644'
    - makedirs: true
{%- if mapdata.mode != "cluster" and mapdata.signing.enabled %}

multimaster-minion-config-signing-pubkey-managed:
  file.managed:
    - name: {{ local.minion_pki_dir }}/master_sign.pub
    - contents: {{ mapdata.signing.public_key | json }}
    - mode: '0644'
    - makedirs: true
{%- endif %}

{#- A minion configured here is set up already: the first-highstate reactor leaves it alone. #}
multimaster-minion-config-first-highstate-mark-managed:
  file.managed:
    - name: {{ local.first_highstate_mark }}
    - contents: set up by multimaster.minion
    - replace: false
    - mode: '0600'

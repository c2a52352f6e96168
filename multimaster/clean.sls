# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}

include:
  - .minion.clean
{%- if mapdata.local.master %}
  - .master.clean
{%- endif %}

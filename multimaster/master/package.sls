# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}

{%- if mapdata.install_packages %}

multimaster-master-package-install-pkg-installed:
  pkg.installed:
    - name: {{ mapdata.lookup.master.pkg }}
{%-   if mapdata.master.gitfs.remotes %}

multimaster-master-package-install-gitfs-pkg-installed:
  pkg.installed:
    - name: {{ mapdata.lookup.master.gitfs_pkg }}
{%-   endif %}
{%- else %}

multimaster-master-package-install-skipped:
  test.nop:
    - name: install_packages is false; salt-master is expected to be installed
{%- endif %}

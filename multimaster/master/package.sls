# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}

{%- if mapdata.install_packages %}

multimaster-master-package-install-pkg-installed:
  pkg.installed:
    - name: {{ mapdata.lookup.master.pkg }}
{%-   if mapdata.master.gitfs.remotes and mapdata.local.gitfs_install == "pkg" %}

multimaster-master-package-install-gitfs-pkg-installed:
  pkg.installed:
    - name: {{ mapdata.lookup.master.gitfs_pkg }}
{%-   elif mapdata.master.gitfs.remotes %}

{#- No bin_env: Salt's pip module uses salt-pip on onedir, else the Python running Salt. #}
multimaster-master-package-install-gitfs-pip-installed:
  pip.installed:
    - name: {{ mapdata.lookup.master.gitfs_pip }}
{%-   endif %}
{%- else %}

multimaster-master-package-install-skipped:
  test.nop:
    - name: install_packages is false; salt-master is expected to be installed
{%- endif %}

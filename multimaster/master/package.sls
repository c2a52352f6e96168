# -*- coding: utf-8 -*-
# vim: ft=sls
{%- set tplroot = tpldir.split("/")[0] %}
{%- from tplroot ~ "/map.jinja" import mapdata with context %}

{%- if mapdata.install_packages %}
{%-   if mapdata.local.salt_master_installed %}

{#- This Salt carries salt-master already (pip, onedir or package): never a second Salt. #}
multimaster-master-package-install-pkg-present:
  test.nop:
    - name: salt-master is installed with this Salt; no package installed
{%-   else %}

multimaster-master-package-install-pkg-installed:
  pkg.installed:
    - name: {{ mapdata.lookup.master.pkg }}
{%-   endif %}
{#- Python dependencies (pygit2 for gitfs, psycopg2 for the job cache), each the way this
    Salt sees it: the execution module decides. No bin_env: Salt's pip module uses salt-pip on
    onedir, else the Python running Salt. #}
{%-   for dep in mapdata.local.python_deps %}

multimaster-master-package-install-{{ dep.part }}-{{ dep.method }}-installed:
  {{ dep.method }}.installed:
    - name: {{ dep.name }}
{%-   endfor %}
{%- else %}

multimaster-master-package-install-skipped:
  test.nop:
    - name: install_packages is false; salt-master is expected to be installed
{%- endif %}

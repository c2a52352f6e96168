# -*- coding: utf-8 -*-
# vim: ft=sls
{#- A cluster master is a master with its cluster options: multimaster.master renders both in
    mode cluster (the cluster file from .config) and restarts the master when either changes. #}

include:
  - multimaster.master

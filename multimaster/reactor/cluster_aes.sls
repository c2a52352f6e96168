# -*- coding: utf-8 -*-
# vim: ft=sls
{#- Reactor for `rotate_cluster_aes_key` (rendered into master.d by multimaster.master in mode
    cluster with an isolated filesystem). Salt fires it on the master that made a new cluster
    AES key; the peers' copies carry `__peer_id` and are not reacted to (the master that rotated
    hands its key on, and the event install_cluster_aes fires to reload a peer carries it too,
    so nothing loops). Any accepted minion can fire this tag: the runner shares only the key
    this master holds, once per key in a window, and a peer installs only a newer key. #}
{#- A reaction that cannot run says so in this master's log, at error level. #}
{%- set runners = opts.extension_modules ~ "/runners/multimaster.py" %}
{%- if not salt["file.file_exists"](runners) %}
{%-   do salt["log.error"]("multimaster: the cluster AES key reactor cannot run: " ~ runners
        ~ " is missing; run salt-run saltutil.sync_all on this master, then restart it") %}
{%- endif %}
{%- if not data.get("__peer_id") %}

multimaster-reactor-cluster-aes-runner-cluster-aes-rotated:
  runner.multimaster.cluster_aes_rotated: []
{%- endif %}

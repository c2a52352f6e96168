# -*- coding: utf-8 -*-
# vim: ft=sls
{#- What the first-highstate reactor (salt-run multimaster.first_highstate) applies to a minion
    that started, as `state.sls multimaster.minion.first_highstate sync_mods=all queue=True`:
    one job that syncs the custom modules first (a new minion has none), then lets
    multimaster.claim_first_highstate claim the minion's mark and run its highstate if it may.
    Nothing here reads the pillar: a new minion may have none yet. #}

multimaster-minion-first-highstate-module-run:
  module.run:
    - multimaster.claim_first_highstate: []

# -*- coding: utf-8 -*-
# vim: ft=sls
{#- The demo lab's highstate: one line per run in <root_dir>/highstates.log, so the lab can
    count how many highstates a minion ran. #}
lab-demo-highstate-recorded:
  cmd.run:
    - name: echo "highstate at $(date +%Y-%m-%dT%H:%M:%S)" >> {{ opts.root_dir }}/highstates.log

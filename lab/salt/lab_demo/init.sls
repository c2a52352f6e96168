# -*- coding: utf-8 -*-
# vim: ft=sls
{#- The demo lab's highstate: one line per run in <cachedir>/highstates.log (the host's own
    /var/cache/salt/minion), so the lab can count how many highstates a minion ran. #}
lab-demo-highstate-recorded:
  cmd.run:
    - name: echo "highstate at $(date +%Y-%m-%dT%H:%M:%S)" >> {{ opts.cachedir }}/highstates.log

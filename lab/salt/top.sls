# -*- coding: utf-8 -*-
# vim: ft=sls
# The demo lab's top file: what a minion's one first highstate applies.
base:
  '*':
    - lab_demo

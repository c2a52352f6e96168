"""
The development toolkit of the lab (``lab/``), the benchmark (``bench/``) and the tests:
``devkit`` for daemons, keys, configs and the Salt CLIs; ``hosts`` for separate namespace hosts.
Tests import it; it imports nothing from ``tests/``.
"""

# The README's commands. Everything installs into .venv from requirements.txt.
# SALT=3006 or SALT=3007: the same pins with that line's Salt (requirements.txt names it), in
# .venv/salt3006 / .venv/salt3007 (`make venv test-compat SALT=3006`).
SALT ?=
ifeq ($(SALT),)
VENV ?= .venv
else
VENV ?= .venv/salt$(SALT)
endif
ifeq ($(SALT),)
PINS := cat requirements.txt
else
PINS := grep -q '^\# salt-$(SALT): ' requirements.txt \
	|| { echo "requirements.txt pins no Salt $(SALT) (\# salt-$(SALT): salt==...)" >&2; exit 1; } \
	&& sed -e '/^salt==/d' -e 's/^\# salt-$(SALT): //' requirements.txt
endif
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
PYTHON ?= python3

# What every supported Salt line runs in CI (`make test-compat SALT=...`): the key plane, whose
# join tests also deliver the master key and serve hot and failover minions from every master,
# and the formula's foundation (master config, local apply). COMPAT=full adds the key plane's
# refusals and the roots plane; fault injection, the cluster and the stand-alone hot, failover,
# reactor and job-cache modules run on the pinned line only. The split keeps CI inside its time.
COMPAT_TESTS := tests/unit/utils/test_multimaster_saltcompat.py \
	tests/unit/modules/test_multimaster_peer_answers.py tests/integration/keys/test_join.py \
	tests/integration/test_master_config.py tests/integration/test_local_apply.py
ifeq ($(COMPAT),full)
COMPAT_TESTS += tests/integration/keys/test_policy.py tests/integration/keys/test_roots.py
endif

.PHONY: venv demo down test test-compat lint bench bench-tools reference

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PINS) > $(VENV)/requirements.txt
	$(BIN)/pip install -q -r $(VENV)/requirements.txt
	touch $@

demo: venv
	$(PY) lab/lab.py demo

down: venv
	$(PY) lab/lab.py down

# Unit and functional tests on every core, each file in one process (its module fixtures, such
# as the job cache's PostgreSQL on a fixed port, exist once); then the daemon suites on two
# workers, each taking whole work units (tests/integration/conftest.py: the separate hosts, the
# key modules, each other module): the hosts' unit is the longest, so a third worker would not
# end the run sooner. DAEMON_WORKERS=0 runs them one module at a time, as a module's own
# figures and a timing failure's second look want. CI sets BEFORE_DAEMONS to wait for what it
# builds in the background.
BEFORE_DAEMONS ?= true
DAEMON_WORKERS ?= 2
test: venv
	$(PY) -m pytest -n auto --dist loadfile tests/unit tests/functional
	$(BEFORE_DAEMONS)
	$(PY) -m pytest -n $(DAEMON_WORKERS) tests/integration

# The forged return rides Salt 3008's unchecked resource_id, which the other lines lack.
COMPAT_SKIP := --deselect \
	tests/integration/keys/test_policy.py::test_a_return_forged_under_a_control_minion_s_id_is_refused
test-compat: venv
	$(PY) -m pytest $(COMPAT_TESTS) $(COMPAT_SKIP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint --strict .
	find multimaster -name '*.sls' -print0 | xargs -0 $(BIN)/salt-lint
	$(PY) scripts/gen_reference.py --check

# docs/reference.md from the loader modules' docstrings.
reference: venv
	$(PY) scripts/gen_reference.py

# The roots benchmark compares with rsync: installed here when missing (Debian, as root or
# through sudo -n), as .ci/run installs the test's system packages.
bench-tools:
	@command -v rsync >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
		$$SUDO apt-get install -y -q --no-install-recommends rsync >/dev/null \
		|| { $$SUDO apt-get update -q >/dev/null \
			&& $$SUDO apt-get install -y -q --no-install-recommends rsync >/dev/null; }; }
	@command -v rsync >/dev/null

bench: venv bench-tools
	$(PY) bench/bench_sync_keys.py
	$(PY) bench/bench_sync_roots.py
	$(PY) bench/bench_reactor.py

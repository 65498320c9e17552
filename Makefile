# Every target creates .venv on first use and installs the project with what it needs: `make demo`
# the package, its runtime dependencies and the inspector its output points at (no system
# package); `make test` everything the tests need, PostgreSQL and Chromium included.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# The tests start throwaway PostgreSQL clusters (ctxrt/pgcluster.py): they need the server's
# binaries (initdb, pg_ctl, postgres), not only the psql client, and PgBouncer, which the lease tests
# start in front of a cluster (ctxrt.pgcluster.start_pooler); the inspector's browser tests the
# OS's headless Chromium and its chromedriver (Chromium can't download a build of its own here).
# apt-get as root, else via sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test soak demo bench clean

$(STAMP): pyproject.toml
	@{ [ -n "$$PG_BINDIR" ] && [ -x "$$PG_BINDIR/initdb" ]; } || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	  || { echo "installing the PostgreSQL server (apt-get install postgresql)"; log=$$(mktemp); \
	       { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } \
	         >$$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; rm -f $$log; }
	@[ -x /usr/sbin/pgbouncer ] \
	  || { echo "installing PgBouncer (apt-get install pgbouncer)"; log=$$(mktemp); \
	       { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer; } \
	         >$$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; rm -f $$log; }
	@{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } \
	  || { echo "installing headless Chromium and its driver (apt-get install chromium chromium-driver)"; log=$$(mktemp); \
	       { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
	         >$$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; rm -f $$log; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# compat: a plain path entry (.pth) rather than setuptools' import hook, which type checkers
	# can't follow, so mypy on a host's script outside the checkout finds ctxrt's types.
	$(BIN)/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

# Two pytest workers (pytest-xdist), a test file to a worker, so one worker's waits (fsync, child
# processes, PostgreSQL) overlap the other's work; each worker starts its own PostgreSQL cluster.
PYTEST_WORKERS := -n 2 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m mypy --cache-dir $(VENV)/mypy_cache  # the [tool.mypy] config in pyproject.toml
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS)

soak: $(STAMP)
	CTXRT_SOAK=1 $(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_WORKERS) -m soak

# Its own stamp: the demo needs none of the test extra (frameworks, Selenium, mypy) or apt.
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[inspector]' --config-settings editable_mode=compat
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m ctxrt demo

bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[test,bench]' --config-settings editable_mode=compat
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

# Everything runs from the project's own virtualenv, made and filled on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Copy of the requirements.txt last installed; pip runs again only when the file changes.
STAMP := $(VENV)/requirements.stamp
PYTEST_ARGS ?=

.PHONY: venv test test-fast demo lint bench-limiter bench-jobs bench-fleet bench-slow bench-million bench-retention \
	bench-export bench-adaptive bench-windows bench-keys chaos scale scale-short

venv:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@cmp -s requirements.txt $(STAMP) || { \
		$(PY) -m pip install --disable-pip-version-check -r requirements.txt && \
		cp requirements.txt $(STAMP); }

# Two processes (pytest-xdist), a test file each at a time: the suite waits on real servers
# and workers as much as it computes, and each process has its own test database and Redis
# namespace (tests/before_settings.py). Then the tests marked `paced`, which measure a pace
# against the wall clock, in one process alone: beside another test process on two cores they
# measure the machine's load, not ratejobs. Even alone, a shared machine can starve their
# processes for a second: a paced test that fails runs once more, alone, and must pass then
# (pytest's --last-failed). TEST_MARK narrows both passes (a pytest -m expression);
# PYTEST_ARGS goes to both (a pass that selects nothing is not an error).
TEST_MARK ?=
test_mark = $(if $(TEST_MARK),($(TEST_MARK)) and $(1),$(1))
test: venv
	$(PY) -m pytest -n 2 --dist loadfile -m "$(call test_mark,not paced)" $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]
	$(PY) -m pytest -n 0 -m "$(call test_mark,paced)" $(PYTEST_ARGS) || [ $$? -eq 5 ] || { \
		echo "paced: a pace missed; its failed tests run once more, alone"; \
		$(PY) -m pytest -n 0 --last-failed --last-failed-no-failures none \
			-m "$(call test_mark,paced)" $(PYTEST_ARGS); }

# The inner loop: everything but the tests that start real Celery workers (e2e), the paced
# ones, those that take seconds of their own (slow) and the browser tests, in two processes.
# `make test` still runs everything.
test-fast: venv
	$(PY) -m pytest -n 2 --dist loadfile -m "not e2e and not paced and not slow" \
		--ignore=tests/browser \
		$(PYTEST_ARGS) || [ $$? -eq 5 ]

# Everything on one machine until Ctrl-C: Redis (found or private), the sandbox API, web on
# WEB_HOST:WEB_PORT (127.0.0.1:8000; WEB_HOST=0.0.0.0 opens it to the network), two workers, beat, Flower on FLOWER_PORT (5555).
# Ctrl-C ends it with status 0: the demo takes the terminal's foreground for its own process
# group, so make itself never sees the SIGINT (on which GNU make stops with "Interrupt").
demo: venv
	$(PY) scripts/demo.py

# The fault suite: a job per fault (worker killed, PostgreSQL and Redis restarted, Redis rolled
# back, beat stopped, broker full) on private PostgreSQL and Redis; a few minutes. Run by .ci/run.
chaos: venv
	$(PY) -m faults.chaos

# Several hosts on this machine (root: network namespaces rjs-*, removed at the end): services,
# two worker hosts and a web host; a job per row: clocks 30 s apart, a Sentinel failover, a
# worker host cut off, a Redis Cluster node and PgBouncer restarted; under ten minutes.
# `$(PY) -m bench.scale --clean` removes what an interrupted run left (docs/scaling.md).
scale: venv
	$(PY) -m bench.scale

# One topology, its baseline and one fault, in about two minutes: run by .ci/run.
scale-short: venv
	$(PY) -m bench.scale --only baseline,worker-cut-off --calls 1000

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench-limiter: venv
	$(PY) -m bench.limiter

# An API enforcing 40 % of its advertised rate: plain CUBIC, learning the real limit, and a
# plain token bucket, one 600-call job each (about a minute).
bench-adaptive: venv
	$(PY) -m bench.adaptive

# ratejobs end to end against the sandbox with no limit: a plain API, one with an in-flight cap
# of 16 and one with a token window, next to bare Celery (a few minutes).
bench-jobs: venv
	$(PY) -m bench.jobs

# The pace at a fast API behind nginx's limit_req (300/s) for fleets of 1 x -c 2 and 2 x -c 4
# workers, with and without an in-flight cap, jobs submitted through REST (about 2 minutes).
bench-fleet: venv
	$(PY) -m bench.fleet

# Slow APIs: 1 s responses at 100/s, and an in-flight cap of 10 at 2 s, next to bare Celery.
bench-slow: venv
	$(PY) -m bench.slow

# One job of a million calls: submit_job's time, broker depth, worker memory and the admin's
# page times while it runs (about 45 minutes on 2 cores; --calls N or --minutes M for less).
bench-million: venv
	$(PY) -m bench.million

# Retention and a purge on a million calls and a million throttle events while a probe writes
# as a worker does; PostgreSQL only (DATABASE_URL), a few minutes; --rows N for less.
bench-retention: venv
	$(PY) -m bench.retention

# A million-call job's results out: export_results and the REST download through gunicorn, in
# calls/s and peak memory; PostgreSQL only (DATABASE_URL), a few minutes; --calls N for less.
bench-export: venv
	$(PY) -m bench.export

# What each window besides the main rate costs a grant (grants/s and Redis time per grant).
bench-windows: venv
	$(PY) -m bench.windows

# Redis memory per credential key's bucket (in use, after its idle expiry), then one key against
# 5,000 round-robin: grants/s through the shared limiter.
bench-keys: venv
	$(PY) -m bench.keys

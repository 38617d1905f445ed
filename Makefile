# Everything runs from a virtual environment the Makefile makes itself.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: install test test-chaos lint demo bench bench-quick bench-ledger chaos sample-config clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[embedded,test,lint]'
	# Nova's api_samples, the specification the API tests read (nova itself is never imported)
	$(BIN)/pip install --quiet --no-deps 'nova>=30.0'
	touch $(STAMP)

# Test files run on $(TEST_WORKERS) pytest-xdist workers, each file whole on one worker
# (its module fixtures start once); those marked serial (they restart the shared
# RabbitMQ) run after, alone. The chaos runs (marked chaos: a RabbitMQ cluster losing
# nodes, a Sentinel set losing its master, every fault once on a small stack; about
# 6 min) are make test-chaos, one at a time; .ci/run runs both. Exit status 5 is
# "nothing selected": PYTEST_ARGS may name files with no test of that kind.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial and not chaos" $(PYTEST_ARGS)
	$(BIN)/pytest -m "serial and not chaos" $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-chaos: $(STAMP)
	$(BIN)/pytest -m chaos $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: $(STAMP)
	$(BIN)/ruff check qsched agents tests
	$(BIN)/ruff format --check qsched agents tests
	$(BIN)/mypy

demo: $(STAMP)
	$(BIN)/qsched-demo $(DEMO_ARGS)

$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

# Every scenario on real servers (about 40 min, 10 to 30 of them the instances scenario's
# 1,000,000 preloaded); --quick and the embedded default leave instances out.
bench: $(BENCH_STAMP)
	$(BIN)/qsched-bench $(BENCH_ARGS)

bench-quick: $(BENCH_STAMP)
	$(BIN)/qsched-bench --quick $(BENCH_ARGS)

bench-ledger: $(STAMP)
	$(BIN)/qsched-ledger-bench $(BENCH_ARGS)

chaos: $(STAMP)
	$(BIN)/qsched-chaos --transport all --duration-s 240 $(CHAOS_ARGS)

sample-config: $(STAMP)
	$(BIN)/oslo-config-generator --config-file deploy/qsched-config-generator.conf
	$(BIN)/oslopolicy-sample-generator --config-file deploy/qsched-policy-generator.conf

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache

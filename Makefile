# The few verbs everyone uses; CI calls the same ones.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install install-redis install-chromium lint test test-fast bench sandbox constraints clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The tests start their own redis-server; install it when missing (Debian, as root).
install-redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else echo "redis-server missing: install it (apt-get install redis-server)" >&2; exit 1; fi; }

# The dashboard's browser test drives Debian's headless Chromium; install it the same way.
install-chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: install it (apt-get install chromium)" >&2; exit 1; fi; }

lint: install
	$(BIN)/ruff check github_broker tests benchmarks
	$(BIN)/mypy

# Test processes (pytest-xdist), each with its own redis-server. Four on two cores: the
# multi-process tests spend much of their time waiting on brokers, GitHub and timers
# (measured on a fresh clone: 3 workers 281 s, 4 workers 236 s).
TEST_WORKERS ?= 4
# worksteal: an idle worker takes queued tests from a busy one, so the long fault tests
# do not leave the others idle at the end of the run.
XDIST := -n $(TEST_WORKERS) --dist worksteal

test: install install-redis install-chromium
	$(BIN)/pytest $(XDIST)

test-fast: install install-redis
	$(BIN)/pytest $(XDIST) -m "not slow"

bench: install install-redis
	$(BIN)/python -m benchmarks.run

# Options go in ARGS: make sandbox ARGS="--port 8090 --agents 5"
sandbox: install
	$(BIN)/github-broker sandbox $(ARGS)

# Pin the runtime dependencies installed in $(VENV) for the Docker image.
constraints: install
	$(BIN)/python scripts/freeze_constraints.py constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info

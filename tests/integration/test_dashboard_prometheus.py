"""Every expression of the Grafana dashboard (deploy/) parsed by promtool and evaluated by a real
Prometheus scraping a real daemon's ``/metrics`` on loopback.  Skipped where Debian's ``prometheus``
package (promtool and the server) is not installed; ``make test`` installs it."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from helpers import GEOMETRIES, data_root, make_kv, make_tokens

from engine_client.client import KVStoreClient

RATE_WINDOW = "30s"  # $__rate_interval: many 1 s scrapes


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expression) of every target, Grafana's variables replaced."""
    with open(os.path.join(data_root(), "deploy", "grafana-dashboard.json")) as fh:
        dashboard = json.load(fh)
    out = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", RATE_WINDOW).replace("$instance", ".*")
            out.append((f"{panel['title']} [{target['refId']}]", expr))
    return out


def test_promtool_parses_every_dashboard_expression(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus; make test does)")
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard_expr_{i}", "expr": e} for i, (_, e) in enumerate(dashboard_targets())]}
        ]
    }
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(rules))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


@pytest.fixture
def prometheus(tmp_path):
    """Start Prometheus scraping ``target`` every second; yields a function taking the target, returning the API port."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (apt-get install prometheus; make test does)")
    procs = []

    def start(target: str) -> int:
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [{"job_name": "kvstore", "static_configs": [{"targets": [target]}]}],
                }
            )
        )
        port = _free_port()
        log = open(tmp_path / "prometheus.log", "wb")
        args = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]
        procs.append((subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), log))
        deadline = time.monotonic() + 30
        while True:
            try:
                if _query(port, 'up{job="kvstore"} == 1'):
                    return port
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.2)

    yield start
    for proc, log in procs:
        proc.terminate()
        proc.wait(30)
        log.close()


def _workload(client: KVStoreClient) -> None:
    """Puts, lookups, reads and page queries: every kvstore_* series moves."""
    geo = GEOMETRIES[2]
    tokens = make_tokens(200, 3)
    pid = client.put_prefix(tokens, make_kv(geo, 200, 3), geo).prefix_id
    for _ in range(3):
        client.lookup(tokens, geo)
        with client.read_chunks(pid, [0, 3, 7]) as got:
            got.to_kv()
    c, m = geo.chunk_tokens, geo.model
    pages = make_kv(geo, 2 * c, 4).reshape(m.num_layers, 2, m.num_kv_heads, 2, c, m.head_dim).transpose(3, 0, 1, 2, 4, 5)
    keys = [b"page-one", b"page-two"]
    client.put_pages(keys, np.ascontiguousarray(pages), geo)  # [pages, layers, 2, kv_heads, chunk_tokens, head_dim]
    client.pages_exist(keys, geo)


def test_prometheus_evaluates_every_dashboard_expression_against_a_daemon(daemon_factory, prometheus):
    d = daemon_factory("--metrics-address", "127.0.0.1:0")  # max_disk_bytes = 0: unlimited, as shipped
    with open(d.ready) as fh:
        metrics_port = int(fh.read().split()[2])
    port = prometheus(f"127.0.0.1:{metrics_port}")
    with KVStoreClient(d.target) as client:
        _workload(client)
    time.sleep(3)  # a few scrapes after the workload: rates over the window are defined
    empty = []
    for name, expr in dashboard_targets():
        result = _query(port, expr)
        if not result:
            empty.append(name)
    # the ratio to capacity is no data while the capacity is unlimited (0), never a ratio to 1 byte
    assert empty == ["Disk used against capacity [A]"], empty
    leased = _query(port, 'kvstore_shm_leased_bytes{instance=~".*"}')
    pinned = _query(port, 'kvstore_pinned_bytes{instance=~".*"}')
    assert len(leased) == len(pinned) == 1  # each its own target: neither hides the other


def test_disk_ratio_is_a_fraction_when_a_capacity_is_set(daemon_factory, prometheus):
    d = daemon_factory("--metrics-address", "127.0.0.1:0", "--max-disk-bytes", "1GiB")
    with open(d.ready) as fh:
        metrics_port = int(fh.read().split()[2])
    port = prometheus(f"127.0.0.1:{metrics_port}")
    with KVStoreClient(d.target) as client:
        _workload(client)
    time.sleep(2)
    (expr,) = [e for name, e in dashboard_targets() if name.startswith("Disk used against capacity")]
    (sample,) = _query(port, expr)
    assert 0 < float(sample["value"][1]) < 0.01  # a few hundred KiB of 1 GiB

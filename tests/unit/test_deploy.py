"""The deployment files agree with the code: every config key listed, the ConfigMap equal to the example."""

import dataclasses
import os
import tomllib

import pytest
from helpers import data_root

from kvstore.config import StoreConfig, load_config
from kvstore.server.config import ServerConfig

DEPLOY = os.path.join(data_root(), "deploy")
SECTIONS = {"store": StoreConfig, "server": ServerConfig}


def read(*parts) -> str:
    with open(os.path.join(data_root(), *parts)) as fh:
        return fh.read()


def fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def configmap_toml() -> str:
    """The ``kvstore.toml: |`` block of the DaemonSet's ConfigMap, unindented."""
    lines = read("deploy", "daemonset.yaml").splitlines()
    start = lines.index("  kvstore.toml: |") + 1
    body = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        body.append(line[4:])
    return "\n".join(body).strip() + "\n"


def test_example_config_lists_every_key_of_every_section():
    with open(os.path.join(DEPLOY, "kvstore.toml"), "rb") as fh:
        data = tomllib.load(fh)
    assert set(data) == set(SECTIONS)
    for section, cls in SECTIONS.items():
        assert set(data[section]) == fields(cls), (section, fields(cls) ^ set(data[section]))


def test_example_config_loads():
    path = os.path.join(DEPLOY, "kvstore.toml")
    for section, cls in SECTIONS.items():
        load_config(cls, path, section)  # types and values valid


def test_daemonset_configmap_is_the_example_config():
    with open(os.path.join(DEPLOY, "kvstore.toml")) as fh:
        assert configmap_toml() == fh.read().strip() + "\n"


def test_daemonset_probes_use_grpc_health_and_run_unprivileged():
    text = read("deploy", "daemonset.yaml")
    assert text.count('"health", "--socket-path"') == 2  # liveness and readiness
    assert "runAsNonRoot: true" in text and "kind: ConfigMap" in text


def test_image_has_no_torch_no_fio_and_a_user():
    steps = [line for line in read("deploy", "Containerfile").splitlines() if not line.startswith("#")]
    text = "\n".join(steps)
    assert "fio" not in text and "torch" not in text and "[engine]" not in text and "nvidia" not in text
    assert "pip install --no-cache-dir ." in text
    assert "USER kvstore:kvstore" in steps
    ignored = read(".dockerignore").split()
    assert {".venv", ".kvstore"} <= set(ignored)


def _daemonset() -> dict:
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all(read("deploy", "daemonset.yaml")))
    return next(d for d in docs if d["kind"] == "DaemonSet")


def test_daemonset_runs_on_gpu_nodes_with_a_memory_limit():
    pod = _daemonset()["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (container,) = pod["containers"]
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert limits["memory"] == requests["memory"]  # the arena is a memfd: it counts against the limit
    arena_mib = 256  # shm_arena_bytes of the ConfigMap
    assert int(limits["memory"].removesuffix("Gi")) * 1024 >= arena_mib + 1024


def test_service_monitor_scrapes_the_daemonset_metrics_port():
    yaml = pytest.importorskip("yaml")
    docs = {d["kind"]: d for d in yaml.safe_load_all(read("deploy", "monitoring.yaml"))}
    container = _daemonset()["spec"]["template"]["spec"]["containers"][0]
    port = next(p for p in container["ports"] if p["name"] == "metrics")
    service, monitor = docs["Service"], docs["ServiceMonitor"]
    assert service["spec"]["selector"] == _daemonset()["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": port["containerPort"], "targetPort": "metrics"}]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics" and monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    with open(os.path.join(DEPLOY, "kvstore.toml"), "rb") as fh:
        assert tomllib.load(fh)["server"]["metrics_address"].endswith(f":{port['containerPort']}")


def test_systemd_unit_waits_for_readiness():
    lines = [line.strip() for line in read("deploy", "kvstore.service").splitlines() if not line.startswith("#")]
    assert "Type=notify" in lines and "NotifyAccess=main" in lines and "Type=simple" not in lines


def test_image_checks_health_and_ships_only_what_runs_in_it():
    text = "\n".join(line for line in read("deploy", "Containerfile").splitlines() if not line.startswith("#"))
    assert "HEALTHCHECK" in text and '"kvstore", "health"' in text.replace("/opt/kvstore/.venv/bin/", "")
    assert "rm /opt/kvstore/.venv/bin/kvstore-bench /opt/kvstore/.venv/bin/kvstore-demo" in text


def test_renamed_keys_are_not_in_the_example_config():
    text = read("deploy", "kvstore.toml") + read("deploy", "daemonset.yaml")
    for old in ServerConfig.RENAMED_KEYS:
        assert old not in text, old

"""The deployment files agree with the code: every config key listed, the ConfigMap equal to the example."""

import dataclasses
import os
import tomllib

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

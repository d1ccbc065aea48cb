"""The committed stubs are what proto/kvstore/v1/ generates today, and the API keeps one message pair per call."""

import os

from kvstore.contract import rpc
from kvstore_tools.gen_proto import PACKAGE_DIR, ROOT, generate


def test_generated_stubs_match_proto(tmp_path):
    paths = generate(str(tmp_path))
    for path in paths:
        committed = os.path.join(ROOT, PACKAGE_DIR, os.path.basename(path))
        assert os.path.exists(committed), f"{committed} is missing: run `python -m kvstore_tools.gen_proto`"
        with open(path) as new, open(committed) as old:
            assert new.read() == old.read(), f"{committed} is stale: run `python -m kvstore_tools.gen_proto`"
    committed = {n for n in os.listdir(os.path.join(ROOT, PACKAGE_DIR)) if n.endswith((".py", ".pyi"))}
    assert committed == {os.path.basename(p) for p in paths}, "stubs left over: run `python -m kvstore_tools.gen_proto`"


def test_every_call_has_its_own_request_and_response():
    methods = [m for s in rpc.SERVICES for m in s.methods]
    assert len(methods) == 27
    for m in methods:
        assert (m.input_type.name, m.output_type.name) == (f"{m.name}Request", f"{m.name}Response"), m.full_name
    assert rpc.KVSTORE_SERVICE == "kvstore.v1.KVStore" and rpc.ADMIN_SERVICE == "kvstore.v1.KVStoreAdmin"


def test_the_messages_live_in_one_file_per_domain():
    files = sorted(f for f in os.listdir(os.path.join(ROOT, "proto", "kvstore", "v1")) if f.endswith(".proto"))
    assert files == [
        "admin.proto",
        "cluster.proto",
        "conversations.proto",
        "frames.proto",
        "geometry.proto",
        "kvstore.proto",
        "pages.proto",
        "prefixes.proto",
        "reads.proto",
        "scores.proto",
        "stats.proto",
    ]

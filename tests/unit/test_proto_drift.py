"""The committed stubs are what proto/kvstore.proto generates today."""

import os

from tools.gen_proto import PACKAGE_DIR, ROOT, generate


def test_generated_stubs_match_proto(tmp_path):
    for path in generate(str(tmp_path)):
        committed = os.path.join(ROOT, PACKAGE_DIR, os.path.basename(path))
        with open(path) as new, open(committed) as old:
            assert new.read() == old.read(), f"{committed} is stale: run `python -m tools.gen_proto`"

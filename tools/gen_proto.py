"""Generate the Python stubs of proto/kvstore.proto into kvstore/_proto/.

    python -m tools.gen_proto [OUT_DIR]

The stubs are committed; tests/unit/test_proto_drift.py regenerates them
into a temporary directory and fails when they differ.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE_DIR = "kvstore/_proto"


def generate(out_dir: str) -> list[str]:
    from grpc_tools import protoc

    # Map proto/ onto the package path so the generated grpc module imports
    # "from kvstore._proto import kvstore_pb2" (an absolute, package import).
    args = [
        "protoc",
        f"-I{PACKAGE_DIR}={os.path.join(ROOT, 'proto')}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"{PACKAGE_DIR}/kvstore.proto",
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    base = os.path.join(out_dir, PACKAGE_DIR)
    return [os.path.join(base, n) for n in ("kvstore_pb2.py", "kvstore_pb2_grpc.py", "kvstore_pb2.pyi")]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for path in generate(tmp):
            dest = os.path.join(argv[0] if argv else os.path.join(ROOT, PACKAGE_DIR), os.path.basename(path))
            shutil.copyfile(path, dest)
            print(f"wrote {os.path.relpath(dest, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's Python quick start, run as a user would run it: its own process, against a real daemon."""

import os
import re
import subprocess
import sys

from helpers import data_root
from pretrained import needs_smollm2

SOCKET = '"unix:.kvstore/run/kvstore.sock"'


def quick_start() -> str:
    """The first ``python`` block after the README's ``python quickstart.py``."""
    with open(os.path.join(data_root(), "README.md")) as f:
        text = f.read()
    after = text[text.index("python quickstart.py") :]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_quick_start_names_the_default_daemons_socket():
    assert SOCKET in quick_start()


@needs_smollm2
def test_the_quick_start_answers_correctly(daemon, tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(quick_start().replace(SOCKET, repr(daemon.target)))
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=240,
        env={**os.environ, "PYTHONPATH": data_root()},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"128 chunks, cache hit False; loaded \d+\.\d% of the KV, TTFT \d+\.\d\d s", first), first
    assert re.fullmatch(r"answer '.*', expected \d{7}: correct", second), second

"""The worker side reaches the daemon's package only through its wire format."""

import subprocess
import sys

from helpers import data_root

CLIENT_MODULES = ("engine_client.client", "engine_client.runner", "engine_client.prefetch", "engine_client.pages")


def test_the_engine_client_loads_nothing_of_the_daemon_server():
    code = (
        f"import sys\nfor m in {CLIENT_MODULES!r}: __import__(m)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('kvstore.server'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=data_root(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""

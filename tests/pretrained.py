"""Helpers for tests on the pretrained models of ``engine_client.model.zoo``."""

import pytest

from engine_client.model import zoo
from kvstore_tools.bench.prefill import prose_text


def real_text() -> str:
    """Apache-2.0 licence text shipped in grpcio's wheel (a pinned dependency): real English prose."""
    return prose_text()


def installed(name: str) -> bool:
    try:
        zoo.locate(name)
    except zoo.ModelNotInstalled:
        return False
    return True


needs_smollm2 = pytest.mark.skipif(not installed("smollm2-135m"), reason=f"needs {zoo.MODELS['smollm2-135m'].install_command}")
# zoo.installed: checks the chunk packages without assembling the file at collection time
needs_gemma3 = pytest.mark.skipif(not zoo.installed("gemma3-270m"), reason=f"needs {zoo.MODELS['gemma3-270m'].install_command}")

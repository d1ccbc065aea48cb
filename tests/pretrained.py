"""Helpers for tests on the pretrained models of ``engine_client.model.zoo``."""

import functools
import warnings

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


@functools.cache
def hf_smollm2(dtype: str):
    """(transformers' SmolLM2-135M from the zoo's GGUF in eval mode, its tokenizer): the independent
    reference, loaded once per test run and dtype (about 15 s each) and shared by the modules that
    compare against it; nothing here changes the model or the tokenizer."""
    import torch
    import transformers

    path = zoo.locate("smollm2-135m")
    with warnings.catch_warnings():  # the reference's own load-time warnings are not ours to fix
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=getattr(torch, dtype))
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tok


needs_smollm2 = pytest.mark.skipif(not installed("smollm2-135m"), reason=f"needs {zoo.MODELS['smollm2-135m'].install_command}")
# zoo.installed: checks the chunk packages without assembling the file at collection time
needs_gemma3 = pytest.mark.skipif(not zoo.installed("gemma3-270m"), reason=f"needs {zoo.MODELS['gemma3-270m'].install_command}")

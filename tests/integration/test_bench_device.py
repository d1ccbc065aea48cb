"""Every bench that runs a model takes ``--device``; asking for CUDA where there is none is one line, before any work."""

import pytest
import torch
from helpers import run_bench

BENCHES = {
    "reprefill": (),
    "accuracy": ("--task", "kv"),
    "decode": (),
    "restore": (),
    "estimator": (),
    "recall": (),
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_cuda_without_a_device_is_refused_in_one_line(bench):
    proc = run_bench(bench, *BENCHES[bench], "--device", "cuda", expect=1)
    assert proc.stderr.strip() == "kvstore-bench: error: --device cuda: torch sees no CUDA device on this machine"


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_device_is_a_choice(bench):
    proc = run_bench(bench, *BENCHES[bench], "--device", "tpu", expect=2)
    assert "--device" in proc.stderr and "invalid choice" in proc.stderr

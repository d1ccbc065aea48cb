"""Every bench that runs a model takes ``--device``; asking for CUDA where there is none is one line, before any work."""

import pytest
import torch
from helpers import run_bench, run_bench_each

BENCHES = {
    "reprefill": (),
    "accuracy": ("--task", "kv"),
    "decode": (),
    "restore": (),
    "estimator": (),
    "recall": (),
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_device_is_refused_in_one_line():
    proc = run_bench("reprefill", "--device", "cuda", expect=1)  # one as the console script runs, every bench in one process
    assert proc.stderr.strip() == "kvstore-bench: error: --device cuda: torch sees no CUDA device on this machine"
    for bench, (status, err) in zip(sorted(BENCHES), run_bench_each([[b, *BENCHES[b], "--device", "cuda"] for b in sorted(BENCHES)])):
        assert (status, err.strip()) == (1, "kvstore-bench: error: --device cuda: torch sees no CUDA device on this machine"), bench


def test_device_is_a_choice():
    for bench, (status, err) in zip(sorted(BENCHES), run_bench_each([[b, *BENCHES[b], "--device", "tpu"] for b in sorted(BENCHES)])):
        assert status == 2 and "--device" in err and "invalid choice" in err, (bench, err)

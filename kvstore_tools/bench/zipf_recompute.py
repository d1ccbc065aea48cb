"""The Zipf workload's ``recompute`` row: each request's prefix and suffix prefilled through every layer, no store.

A serving engine without kvstore recomputes the shared prefix for every
request: this row is that, timed in the same rotation as the systems (so
background load falls on it alike) and compared with the same full-KV
reference.  Nothing is read, so its storage columns are empty; the device's
queue is waited for before the clock stops.  ``--task`` runs have no such
row (what a recompute answers is the ``full`` column).
"""

from __future__ import annotations

import time

import torch

KEY = "recompute"


class RecomputeRun:
    key = KEY

    def __init__(self, model):
        self.model = model
        self.rows: list[dict] = []

    def request(self, prefix, req, reference) -> dict:
        from engine_client.prefill import chunked_prefill
        from engine_client.reprefill.device import wait
        from kvstore_tools.bench.fidelity import compare_logits

        tokens = torch.cat([prefix.tokens, torch.as_tensor(req.suffix, dtype=prefix.tokens.dtype)])
        t0 = time.perf_counter()
        logits, _ = chunked_prefill(self.model, tokens, keep_kv=False)
        logits = wait(logits)
        ttft = time.perf_counter() - t0
        top1, kl = compare_logits(reference, logits)
        nothing_read = {"io_wait_s": 0.0, "select_s": 0.0, "tokens_loaded": 0, "bytes_disk": 0, "state_bytes_fetched": 0}
        return {"ttft_s": ttft, "compute_s": ttft, **nothing_read, "units": 0, "hit_units": 0, "top1": float(top1), "kl": float(kl)}

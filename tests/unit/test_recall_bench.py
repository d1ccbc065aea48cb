"""Pure parts of ``kvstore-bench recall`` and the named selection systems."""

import numpy as np
import pytest
import torch

from kvstore.contract.errors import InvalidArgument
from kvstore_tools.bench.recall import chunk_summaries, needle_recall, period_recall
from kvstore_tools.bench.text_accuracy import check_store_probe_bits, parse_paths


def test_chunk_summaries_match_the_per_chunk_min_max_with_a_short_last_chunk():
    keys = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)  # [Hkv, n=5, d]
    kmin, kmax = chunk_summaries(keys, 2)
    assert kmin.shape == (3, 2, 3)
    torch.testing.assert_close(kmin[2], keys[:, 4])  # the last chunk holds one token
    torch.testing.assert_close(kmax[0], keys[:, 1])


def test_period_recall_credits_each_layer_with_its_period_s_first_layer():
    per_layer = np.array([[0.0, 1.0, 0.5, 1.0, 1.0]])  # [examples, layers]
    periods, loaded = period_recall(per_layer, 2)
    assert periods.tolist() == [[0.0, 0.5, 1.0]]
    assert loaded.tolist() == [[0.0, 0.0, 0.5, 0.5, 1.0]]
    assert needle_recall(torch.tensor([0, 3, 7]), np.array([3, 4])) == 0.5


def test_paths_name_selectors_and_systems_old_names_included():
    assert parse_paths("full,layerwise@0.05,summary@0.1") == [
        ("full", "", 1.0),
        ("layerwise@0.05", "layerwise", 0.05),
        ("summary@0.1", "summary", 0.1),
    ]
    assert parse_paths("ckv+int4-probes+standins@0.05") == [("ckv+int4-probes+standins@0.05", "ckv+int4-probes+standins", 0.05)]
    assert parse_paths(None) == [("ckv+probes+standins@0.05", "ckv+probes+standins", 0.05)]  # the default system
    with pytest.raises(ValueError, match="SYSTEM@BUDGET.*layerwise"):
        parse_paths("bogus@0.05")
    with pytest.raises(InvalidArgument, match="system"):
        from engine_client.reprefill import parse_system

        parse_system("ckv+nope")


def test_a_store_of_quantized_probe_keys_takes_only_exact_paths_of_its_width():
    paths = parse_paths("full,summary@0.1,perlayer-follow-int4@0.05")
    check_store_probe_bits(paths, 4, 8)  # summary needs no probe keys; int4 reads them as stored
    check_store_probe_bits(parse_paths("exact@0.05"), 0, 8)  # full-precision keys: any path
    for text, bits in (("exact@0.05", 4), ("perlayer-follow@0.05", 4), ("perlayer-follow-int4@0.05", 8)):
        with pytest.raises(ValueError, match=f"--store-probe-bits {bits}: path .* exact paths need probe_bits={bits}"):
            check_store_probe_bits(parse_paths(text), bits, 8)

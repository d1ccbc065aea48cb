"""Tensor parallelism on the page API: each rank stores and loads its own KV heads under the engine's keys."""

import numpy as np
import pytest
from test_pages import make_pages, page_keys

from engine_client.client import KVStoreClient
from engine_client.pages import rank_fingerprint
from kvstore.contract.geometry import ModelSpec, StoreGeometry

FULL = StoreGeometry(ModelSpec(6, 4, 8, "bfloat16"), chunk_tokens=16, group_layers=4)  # 4 KV heads in all
TP = 2
RANK = StoreGeometry(ModelSpec(6, 4 // TP, 8, "bfloat16"), chunk_tokens=16, group_layers=4)  # each rank's 2 heads


def test_each_rank_gets_back_exactly_its_own_heads_under_one_key_scheme(daemon):
    pages, keys = make_pages(FULL, 7, 1), page_keys(7, 1)  # [pages, layers, 2, 4 heads, tokens, dim]
    share = [np.ascontiguousarray(pages[:, :, :, r * 2 : (r + 1) * 2]) for r in range(TP)]  # rank r's heads
    fps = [rank_fingerprint("qwen", r, TP) for r in range(TP)]
    assert fps == ["qwen#tp2.0", "qwen#tp2.1"] and rank_fingerprint("qwen", 0, 1) == "qwen"
    with KVStoreClient(daemon.target) as r0, KVStoreClient(daemon.target) as r1:  # one client per rank process
        ranks = [r0, r1]
        # rank 1 saves first: the scheduler, asking every rank, sees nothing loadable until both have
        assert ranks[1].put_pages(keys, share[1], RANK, namespace="t", model_fingerprint=fps[1]).pages_written == 7
        leading = [ranks[0].pages_exist(keys, RANK, namespace="t", model_fingerprint=fp).num_leading for fp in fps]
        assert leading == [0, 7] and min(leading) == 0
        assert ranks[0].put_pages(keys[:5], share[0][:5], RANK, namespace="t", model_fingerprint=fps[0]).pages_written == 5
        assert min(ranks[0].pages_exist(keys, RANK, namespace="t", model_fingerprint=fp).num_leading for fp in fps) == 5
        for r in range(TP):
            got = ranks[r].get_pages(keys[:5], RANK, namespace="t", model_fingerprint=fps[r])
            np.testing.assert_array_equal(got, share[r][:5])
            out = np.zeros((5, 2, 2, 2, 16, 8), np.uint16)  # a layer range into the rank's own buffer
            ranks[r].get_pages_into(keys[:5], out, RANK, namespace="t", model_fingerprint=fps[r], layer_start=3, layer_end=5)
            np.testing.assert_array_equal(out, share[r][:5, 3:5])
        # the ranks' halves are the whole heads again, and the unsplit model is a third set of pages
        both = np.concatenate([ranks[r].get_pages(keys[:5], RANK, namespace="t", model_fingerprint=fps[r]) for r in range(TP)], axis=3)
        np.testing.assert_array_equal(both, pages[:5])
        assert ranks[0].pages_exist(keys, FULL, namespace="t", model_fingerprint="qwen").num_leading == 0
        assert len(ranks[0].list_prefixes("t")) == 2  # one batch per rank's put


@pytest.mark.parametrize(
    "rank, size, message",
    [(2, 2, r"^tp_rank: must be in \[0, 2\)"), (-1, 2, r"^tp_rank"), (0, 0, r"^tp_rank"), (0.0, 2, r"^tp_rank: must be an integer")],
)
def test_a_rank_outside_the_group_is_refused(rank, size, message):
    with pytest.raises(ValueError, match=message):
        rank_fingerprint("qwen", rank, size)

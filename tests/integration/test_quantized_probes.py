"""Probe keys stored quantized (``StoreGeometry.probe_bits``), through a real daemon and real files."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import flat_config, make_kv, make_tokens

from engine_client.client import KVStoreClient
from engine_client.reprefill import ModelRunner, parse_system
from kvstore.contract.errors import InvalidArgument
from kvstore.contract.geometry import ModelSpec, StoreGeometry
from kvstore.contract.kv_values import keys_as_float32
from kvstore.contract.probes import dequantize_probe_rows, quantize_probe_rows, unpack_probe_rows

# odd sizes: 5 layers in groups of 2 (2, 2, 1), 150 tokens (the last chunk short)
GEO = StoreGeometry(ModelSpec(5, 2, 16, "bfloat16"), chunk_tokens=16, group_layers=2, probe_bits=4)


def first_layer_keys(geo: StoreGeometry, kv: np.ndarray, group: int) -> np.ndarray:
    """The group's first layer's keys as float32: ``[Hkv, n, d]``."""
    return keys_as_float32(kv[group * geo.group_layers, 0], geo.model.dtype)


@pytest.mark.parametrize("bits", [4, 8])
def test_probe_keys_come_back_packed_within_half_a_step(daemon, bits):
    geo, n = replace(GEO, probe_bits=bits), 150
    kv, d, heads = make_kv(GEO, n, 1), GEO.model.head_dim, GEO.model.num_kv_heads
    with KVStoreClient(daemon.target) as client:
        pid = client.put_prefix(make_tokens(n, 1), kv, geo).prefix_id
        assert client.describe(pid).geometry == geo
        for g in range(geo.num_groups):
            rows = client.get_probe_keys(pid, g)
            assert rows.dtype == np.uint8 and rows.shape == (heads, n, d * bits // 8 + 4)
            assert rows.nbytes == heads * n * (d * bits // 8 + 4) == geo.probe_bytes(n)
            keys = first_layer_keys(geo, kv, g)
            _, scales = unpack_probe_rows(rows, bits, d)  # [Hkv, n, 1]
            assert np.all(np.abs(dequantize_probe_rows(rows, bits, d) - keys) <= scales / 2 * (1 + 1e-5) + 1e-12)
            np.testing.assert_array_equal(rows, quantize_probe_rows(keys, bits))  # the one format, whoever quantizes
        assert all(r.ok for r in client.verify(pid))


def test_a_prefix_extending_a_stored_one_reads_its_packed_rows_across_both_segments(daemon):
    c = GEO.chunk_tokens
    tokens_a, kv_a = make_tokens(100, 1), make_kv(GEO, 100, 1)
    tokens_b = np.concatenate([tokens_a[:85], make_tokens(60, 2)])  # shares A's first 5 full chunks
    kv_b = make_kv(GEO, 145, 2)
    kv_b[:, :, :, : 5 * c] = kv_a[:, :, :, : 5 * c]
    with KVStoreClient(daemon.target) as client:
        client.put_prefix(tokens_a, kv_a, GEO)
        b = client.put_prefix(tokens_b, kv_b, GEO)
        assert b.reused_chunks == 5
        assert {p.prefix_id: p.num_segments for p in client.list_prefixes()}[b.prefix_id] == 2
        for g in range(GEO.num_groups):
            rows = client.get_probe_keys(b.prefix_id, g)
            assert rows.shape[1] == 145
            np.testing.assert_array_equal(rows, quantize_probe_rows(first_layer_keys(GEO, kv_b, g), 4))


def test_reprefill_on_stored_4bit_probes_selects_and_answers_as_client_quantization_does(daemon, tiny_model):
    gen = torch.Generator().manual_seed(3)
    prefix, suffix = torch.randint(0, 500, (301,), generator=gen), torch.randint(0, 500, (9,), generator=gen)
    cfg = parse_system("ckv+int4-probes").replace(budget=0.25, report_attention=False)
    n = prefix.numel()
    with KVStoreClient(daemon.target) as client:
        stored = ModelRunner(tiny_model, client, group_layers=1, probe_bits=4)  # the daemon quantizes
        plain = ModelRunner(tiny_model, client, group_layers=1, probe_bits=0)  # full-precision region; the client quantizes
        pid_q, pid_f = stored.store_prefix(prefix).prefix_id, plain.store_prefix(prefix).prefix_id
        assert pid_q != pid_f  # another layout, another id
        geo = stored.geometry
        res_q, res_f = stored.reprefill(pid_q, suffix, cfg), plain.reprefill(pid_f, suffix, cfg)
        # the same format on both sides: the same codes, chunks and logits
        assert [s.tolist() for s in res_q.selected] == [s.tolist() for s in res_f.selected]
        torch.testing.assert_close(res_q.logits, res_f.logits, atol=0, rtol=0)
        heads, d = geo.model.num_kv_heads, geo.model.head_dim
        assert res_q.probe_bytes == geo.num_groups * heads * n * (d // 2 + 4)  # packed rows, both groups
        assert res_f.probe_bytes == geo.num_groups * heads * n * d * 4  # float32 keys
        assert stored.resident_bytes() == plain.resident_bytes() == res_q.probe_bytes
        assert stored.reprefill(pid_q, suffix[:5], cfg).probe_bytes == 0  # resident since
        # decoding that re-selects scores with the same resident keys, the prefix named by a leading part
        again = cfg.replace(reselect_every=2)
        gen_q, gen_f = stored.generate(pid_q[:16], suffix, again, 4), plain.generate(pid_f, suffix, again, 4)
        assert gen_q.tokens == gen_f.tokens and gen_q.reselect.reselections == gen_f.reselect.reselections > 0
        # a runner storing full precision reads a 4-bit prefix as it is stored
        assert plain.reprefill(pid_q, suffix, cfg).probe_bytes == res_q.probe_bytes


def test_a_request_for_another_probe_width_is_refused_and_changes_nothing(daemon, tiny_model):
    prefix = torch.randint(0, 500, (200,), generator=torch.Generator().manual_seed(4))
    with KVStoreClient(daemon.target) as client:
        runner = ModelRunner(tiny_model, client, group_layers=1, probe_bits=4)
        pid = runner.store_prefix(prefix).prefix_id
        before = client.stats().bytes_read, runner.resident_bytes(), client.get_scores(pid, 0).importance
        base = flat_config(budget=0.25, period_layers=1, selector="exact", head_aggregation="max")
        for bits, asked in ((0, "full-precision"), (8, "8-bit")):
            with pytest.raises(InvalidArgument) as err:
                runner.reprefill(pid, [1, 2, 3], base.replace(probe_bits=bits))
            msg = str(err.value)
            assert err.value.field == "probe_bits" and "\n" not in msg
            assert "stores its probe keys quantized to 4 bits" in msg and asked in msg and "probe_bits=4" in msg
        assert client.stats().bytes_read == before[0] and runner.resident_bytes() == before[1]
        np.testing.assert_array_equal(client.get_scores(pid, 0).importance, before[2])
        # selectors that need no probe keys, and the stored width, still serve the prefix
        assert runner.reprefill(pid, [1, 2, 3], base.replace(selector="summary")).probe_bytes == 0
        assert runner.reprefill(pid, [1, 2, 3], base.replace(probe_bits=4)).probe_bytes > 0

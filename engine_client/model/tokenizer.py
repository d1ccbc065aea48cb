"""Text <-> token ids for a decoder checkpoint, built from GGUF metadata or an HF ``tokenizer.json``.

A GGUF file carries its tokenizer as metadata: ``tokenizer.ggml.model``
(``gpt2`` = byte-level BPE), ``tokens``, ``merges``, ``token_type`` (3 =
control: special tokens such as ``<|im_start|>``), the bos/eos/pad ids,
``tokenizer.ggml.pre`` (which pre-tokenizer split the merges were learned
on) and ``tokenizer.chat_template`` (Jinja).  ``tokenizer_from_gguf``
rebuilds it with the ``tokenizers`` library; ``Tokenizer.save`` writes the
HF files (``tokenizer.json``, ``tokenizer_config.json`` with the chat
template) that ``Tokenizer.load`` reads back from a checkpoint directory.

``tokenizer.ggml.model`` = ``llama`` is a SentencePiece BPE vocabulary
(Gemma's): tokens in ``▁``-for-space spelling with scores and no merges,
byte tokens ``<0x00>``..``<0xFF>`` (type 6) for byte fallback, user-defined
tokens (type 4: ``\n``, ``\n\n``, ``</div>``...) matched whole.  The
merges are rebuilt from the vocabulary: every split of a token into two
tokens, ranked by the merged token's id (for the ordinary tokens the same
order as their scores, which is what llama.cpp merges by); runs of spaces
are stored as real spaces and respelled ``▁▁``... so they merge like the
rest.  ``tokenizer.ggml.add_bos_token`` says whether the model expects
``<bos>`` first (``encode_prompt``).

The chat template is rendered with Jinja2 in a sandbox, as transformers
does (``trim_blocks``, ``lstrip_blocks``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .loader import CheckpointError, MissingCheckpointFile

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_CONTROL = 3  # llama.cpp token type of special tokens
_USER_DEFINED = 4  # llama.cpp token type of added tokens that are not special (Gemma's "\n", "</div>")
_SPACE = "\u2581"  # SentencePiece's spelling of a space

# tokenizer.ggml.pre -> split before the byte-level BPE.  llama.cpp's
# 'smollm' (and 'starcoder', 'refact', ...) split every digit apart, then
# apply the GPT-2 regex; 'gpt2'/'default' use the GPT-2 regex alone.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva")
_GPT2_ONLY = ("gpt2", "default")


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError("tokenizing text needs the 'tokenizers' package: pip install tokenizers") from None
    return tokenizers


@dataclass
class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the model's special ids and chat template."""

    backend: object  # tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    chat_template: str | None
    add_bos_token: bool = False  # the model expects bos_token_id before a prompt (Gemma)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; special tokens written in it (``<|im_start|>``) become their single ids."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of ``text`` as a model input: ``encode`` with ``<bos>`` first where the model expects it."""
        ids = self.encode(text)
        return [self.bos_token_id, *ids] if self.add_bos_token and self.bos_token_id is not None else ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int:
        found = self.backend.token_to_id(token)
        if found is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return found

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The model's prompt text for ``messages`` (``[{"role": ..., "content": ...}]``)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template")
        return _render(self.chat_template, messages, add_generation_prompt, self)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))

    def save(self, directory) -> None:
        """Write ``tokenizer.json`` and ``tokenizer_config.json`` (special tokens, chat template) to ``directory``."""
        directory = Path(directory)
        self.backend.save(str(directory / TOKENIZER_FILE))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": self.add_bos_token, "clean_up_tokenization_spaces": False}
        for key in ("bos", "eos", "pad"):
            token_id = getattr(self, f"{key}_token_id")
            if token_id is not None:
                config[f"{key}_token"] = self.backend.id_to_token(token_id)
        if self.chat_template:
            config["chat_template"] = self.chat_template
        (directory / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, directory) -> Tokenizer:
        """Read ``tokenizer.json`` (+ ``tokenizer_config.json`` if present) from a checkpoint directory."""
        directory = Path(directory)
        path = directory / TOKENIZER_FILE
        if not path.is_file():
            raise MissingCheckpointFile(f"no {TOKENIZER_FILE} in checkpoint directory {directory}")
        backend = _tokenizers().Tokenizer.from_file(str(path))
        cfg_path = directory / TOKENIZER_CONFIG_FILE
        config = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}

        def special(key):
            token = config.get(f"{key}_token")
            if isinstance(token, dict):  # AddedToken serialized by transformers
                token = token.get("content")
            return None if token is None else backend.token_to_id(token)

        add_bos = bool(config.get("add_bos_token", False))
        return cls(backend, special("bos"), special("eos"), special("pad"), config.get("chat_template"), add_bos)


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    """Byte-level BPE (``gpt2``) or SentencePiece BPE (``llama``) tokenizer from a GGUF file's ``tokenizer.*`` metadata."""
    tk = _tokenizers()
    kind = meta.get("tokenizer.ggml.model")
    if kind == "llama":
        return _sentencepiece_from_gguf(tk, meta)
    if kind != "gpt2":
        raise CheckpointError(
            f"GGUF tokenizer model {kind!r} is not supported (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE)"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise CheckpointError("GGUF metadata has no tokenizer.ggml.tokens / tokenizer.ggml.merges")
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(tk, meta.get("tokenizer.ggml.pre", "default"))
    backend.decoder = tk.decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or ()
    specials = [tk.AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    backend.add_special_tokens(specials)

    def special(key):
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if value is None else int(value)

    return Tokenizer(backend, special("bos"), special("eos"), special("padding"), meta.get("tokenizer.chat_template"))


def _special_id(meta: dict, key: str) -> int | None:
    value = meta.get(f"tokenizer.ggml.{key}_token_id")
    return None if value is None else int(value)


def _sentencepiece_from_gguf(tk, meta: dict) -> Tokenizer:
    """SentencePiece BPE with byte fallback (Gemma's vocabulary) as a ``tokenizers`` BPE; see the module docstring."""
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    if not tokens or not types or len(types) != len(tokens):
        raise CheckpointError("GGUF metadata has no tokenizer.ggml.tokens / tokenizer.ggml.token_type of one length")
    if meta.get("tokenizer.ggml.add_space_prefix", False):
        raise CheckpointError("GGUF SentencePiece tokenizer with add_space_prefix=true is not supported (Gemma's has none)")
    spelled = [_SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]  # "  " -> "▁▁"
    vocab = {token: i for i, token in enumerate(spelled)}
    merges = []
    for token in spelled:  # in id order: the merge rank; within a token, shorter left part first
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append((left, right))
    unk = _special_id(meta, "unknown")
    model = tk.models.BPE(vocab=vocab, merges=merges, unk_token=None if unk is None else tokens[unk], fuse_unk=True, byte_fallback=True)
    backend = tk.Tokenizer(model)
    backend.normalizer = tk.normalizers.Replace(" ", _SPACE)
    backend.decoder = tk.decoders.Sequence([tk.decoders.Replace(_SPACE, " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()])
    specials = [tk.AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    backend.add_special_tokens(specials)
    added = [
        tk.AddedToken(tokens[i], special=False, normalized=False)
        for i, t in enumerate(types)
        if t == _USER_DEFINED and tokens[i] == spelled[i]
    ]
    backend.add_tokens(added)
    return Tokenizer(
        backend,
        _special_id(meta, "bos"),
        _special_id(meta, "eos"),
        _special_id(meta, "padding"),
        meta.get("tokenizer.chat_template"),
        bool(meta.get("tokenizer.ggml.add_bos_token", True)),  # llama.cpp adds <bos> to a SentencePiece vocabulary unless told not to
    )


def _pre_tokenizer(tk, pre: str):
    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2:
        return tk.pre_tokenizers.Sequence([tk.pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _GPT2_ONLY:
        return byte_level
    raise CheckpointError(f"GGUF pre-tokenizer {pre!r} is not supported (supported: {', '.join(_DIGITS_THEN_GPT2 + _GPT2_ONLY)})")


def _render(template: str, messages: list[dict], add_generation_prompt: bool, tok: Tokenizer) -> str:
    try:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ImportError("chat templates need the 'jinja2' package: pip install jinja2") from None

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception

    def token(token_id):
        return "" if token_id is None else tok.backend.id_to_token(token_id)

    return env.from_string(template).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        bos_token=token(tok.bos_token_id),
        eos_token=token(tok.eos_token_id),
    )

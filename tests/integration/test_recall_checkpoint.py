"""The committed recall checkpoint loads and answers as its card says.

A small held-out slice of key-value retrieval at 2048 tokens, answered with
the full KV, must be consistent with the card's full-KV accuracy (the card's
figure lies in the slice's Wilson interval, or the two intervals overlap);
with the answer record's chunks dropped from the KV the same questions fall
to near chance.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from engine_client.model import load_checkpoint
from engine_client.prefill import chunked_prefill
from kvstore_tools.bench import accuracy as acc

CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "recall-small"
SLICE = 24  # examples; the whole file stays well under a minute on two shared cores
TOKENS = 2048


def card_row(task: str, path: str, tokens: int) -> tuple[int, int]:
    """(correct, examples) of the card's accuracy table row for (task, path, tokens)."""
    text = (CHECKPOINT / "CARD.md").read_text(encoding="utf-8")
    row = re.search(rf"^\|\s*{task}\s*\|\s*{re.escape(path)}\s*\|\s*{tokens}\s*\|\s*(\d+)\s*/\s*(\d+)\s*\|", text, re.M)
    assert row, f"CARD.md has no accuracy row for {task} / {path} / {tokens}"
    return int(row.group(1)), int(row.group(2))


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(2)
    return load_checkpoint(CHECKPOINT)


@pytest.fixture(scope="module")
def kv_answers(model):
    """(answer, full-KV prediction, drop-answer prediction) for each example of the slice."""
    out = []
    for ex in acc.held_out_examples("kv", SLICE, TOKENS, seed=0, need_prefix_answer=True):
        _, kv = chunked_prefill(model, torch.from_numpy(ex.prefix))
        full = int(acc.answer_logits(model, kv, ex.prefix.size, ex.suffix).argmax())
        keep = acc.keep_rows_without(ex.prefix.size, ex.answer_chunks(acc.CHUNK_TOKENS))
        dropped = int(acc.answer_logits(model, kv, ex.prefix.size, ex.suffix, keep).argmax())
        out.append((ex.answer, full, dropped))
    return out


def test_checkpoint_is_the_documented_architecture(model):
    c = model.config
    assert c.architecture == "Qwen2ForCausalLM" and c.num_hidden_layers % 4 == 0
    assert c.num_attention_heads > c.num_key_value_heads  # GQA
    assert model.fingerprint and len(model.fingerprint) == 64


def test_full_kv_accuracy_matches_the_card(kv_answers):
    card_correct, card_total = card_row("kv", "full", TOKENS)
    claimed = card_correct / card_total
    assert claimed >= 0.95
    card_lo, card_hi = acc.wilson_interval(card_correct, card_total)
    correct = sum(answer == full for answer, full, _ in kv_answers)
    lo, hi = acc.wilson_interval(correct, len(kv_answers))
    assert lo <= claimed <= hi or (lo <= card_hi and card_lo <= hi), (
        f"{correct}/{len(kv_answers)} correct: interval {lo:.3f}..{hi:.3f} is inconsistent with the card's "
        f"{card_correct}/{card_total} ({card_lo:.3f}..{card_hi:.3f})"
    )


def test_dropping_the_answer_record_leaves_chance(kv_answers):
    correct = sum(answer == dropped for answer, _, dropped in kv_answers)
    lo, _ = acc.wilson_interval(correct, len(kv_answers))
    assert lo <= 3 * acc.chance_level("kv"), f"{correct}/{len(kv_answers)} right without the answer record"
    assert correct <= len(kv_answers) // 4


def test_wilson_interval_and_path_parsing():
    lo, hi = acc.wilson_interval(19, 20)
    assert round(lo, 4) == 0.7639 and round(hi, 4) == 0.9911  # textbook values for 19/20
    assert acc.wilson_interval(0, 10)[0] == 0.0
    assert acc.parse_path("summary@0.25") == acc.EvalPath("reprefill", "summary", 0.25)
    for bad in ("dense", "summary@0", "summary@2", "bogus@0.5", "exact@x"):
        with pytest.raises(ValueError):
            acc.parse_path(bad)
    assert np.isclose(acc.chance_level("fewshot"), 1 / 8)

"""Real-text tasks: deterministic per seed, the needle where it is said to be, answers scored as stated."""

import json

import numpy as np
import pytest
from pretrained import needs_smollm2

from engine_client.model import zoo
from kvstore_tools.tasks import text
from kvstore_tools.tasks.text import jsonl
from kvstore_tools.tasks.text.base import answer_in

pytestmark = needs_smollm2


@pytest.fixture(scope="module")
def tok():
    return zoo.load("smollm2-135m").tokenizer


@pytest.mark.parametrize("task", sorted(text.TASKS))
def test_examples_are_deterministic_and_hold_the_needle(tok, task):
    a = text.examples(task, tok, 3, 700, depths=[0.0, 0.5, 1.0])
    b = text.examples(task, tok, 3, 700, depths=[0.0, 0.5, 1.0])
    for x, y in zip(a, b):
        assert np.array_equal(x.prefix_tokens, y.prefix_tokens) and np.array_equal(x.suffix_tokens, y.suffix_tokens)
        assert x.answers == y.answers and x.needle_spans == y.needle_spans
    assert len({ex.answers for ex in a}) == 3  # seeds differ
    for ex in a:
        assert ex.seed >= text.EVAL_SEED_START and ex.task == task
        assert 0 < ex.num_prefix_tokens <= 700 and ex.suffix_tokens.size > 0
        needle_text = "".join(tok.decode(ex.prefix_tokens[s:e]) for s, e in ex.needle_spans)
        if task == "vt":
            assert all(name in needle_text for name in ex.answers)
        else:
            assert all(answer in needle_text for answer in ex.answers)
        assert not any(answer_in(answer, tok.decode(ex.suffix_tokens)) for answer in ex.answers if task != "vt")
        chunks = ex.needle_chunks(16)
        assert all(any(s // 16 <= c <= (e - 1) // 16 for s, e in ex.needle_spans) for c in chunks)


@pytest.mark.parametrize("task", ["passkey", "niah"])
def test_depth_places_the_needle_and_lengths_are_filled(tok, task):
    for n in (1024, 2048):
        first, mid, last = text.examples(task, tok, 3, n, depths=[0.0, 0.5, 1.0])
        for ex in (first, mid, last):
            assert n - 120 <= ex.num_prefix_tokens <= n  # filled to the last whole sentence that fits
        assert first.needle_spans[0][0] < 40  # right after the instruction
        assert last.needle_spans[0][1] == last.num_prefix_tokens  # right before the question
        assert abs(mid.needle_spans[0][0] / mid.num_prefix_tokens - 0.5) < 0.1


def test_seed_streams_are_disjoint():
    assert text.seeds(3) == [1_000_000, 1_000_001, 1_000_002]
    assert text.seeds(3, "tune") == [0, 1, 2]
    with pytest.raises(ValueError, match="below 1000"):
        text.seeds(10, "tune", start=995)
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        text.examples("nope", None, 1, 100)


def test_scoring_whole_numbers_and_all_values():
    assert answer_in("12345", " 12345.") and not answer_in("12345", " 123456") and not answer_in("12345", "1234")
    assert answer_in("ABCDE", "they are: abcde, X") and not answer_in("ABCDE", "ABCDEF")
    ex = text.TextExample("t", 0, np.zeros(1, np.int64), np.zeros(1, np.int64), ("11", "22"), (), require_all=True)
    assert ex.is_correct("11 and 22") and not ex.is_correct("11 and 23")


def _write(tmp_path, lines):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_tasks(tmp_path, tok):
    good = {
        "prefix": "Alice keeps the key in the red box. Bob has none.",
        "question": " Where is the key? In the",
        "answers": ["red box"],
        "needle": "red box",
    }
    path = _write(tmp_path, [json.dumps(good), "", json.dumps({**good, "answers": ["blue"], "max_new_tokens": 3})])
    a, b = text.examples(f"file:{path}", tok, 5, 0)
    assert tok.decode(a.prefix_tokens) == good["prefix"] and tok.decode(a.suffix_tokens) == good["question"]
    assert "red box" in tok.decode(a.prefix_tokens[slice(*a.needle_spans[0])]) and a.meta["max_new_tokens"] == 16
    assert a.is_correct(" red box.") and b.answers == ("blue",) and b.meta["max_new_tokens"] == 3


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r":2: not JSON"),
        ('["a"]', r":2: must be a JSON object"),
        ('{"prefix": "p", "answers": ["a"]}', r":2: field 'question' is missing"),
        ('{"prefix": "p", "question": "q", "answers": "a"}', r":2: field 'answers' must be list"),
        ('{"prefix": "p", "question": "q", "answers": []}', r":2: field 'answers' must be a non-empty list"),
        ('{"prefix": "p", "question": "q", "answers": ["a"], "extra": 1}', r":2: field 'extra' is unknown"),
        ('{"prefix": "p", "question": "q", "answers": ["a"], "needle": "zz"}', r":2: field 'needle' does not occur"),
        ('{"prefix": " ", "question": "q", "answers": ["a"]}', r":2: field 'prefix' must not be empty"),
    ],
)
def test_jsonl_errors_name_line_and_field(tmp_path, line, message):
    path = _write(tmp_path, ['{"prefix": "p", "question": "q", "answers": ["a"]}', line])
    with pytest.raises(jsonl.TaskFileError, match=message) as err:
        jsonl.read(path)
    assert "\n" not in str(err.value)
    with pytest.raises(jsonl.TaskFileError, match="cannot read"):
        jsonl.read(str(tmp_path / "missing.jsonl"))


def test_question_position_variants_share_the_history_and_move_the_question(tok):
    base = text.examples("multiturn", tok, 2, 700)
    where = {}
    for name in ("multiturn-qbegin", "multiturn-qmiddle", "multiturn-qend"):
        for ex, ref in zip(text.examples(name, tok, 2, 700), base):
            assert np.array_equal(ex.prefix_tokens, ref.prefix_tokens) and ex.answers == ref.answers  # the same history
            suffix = tok.decode(ex.suffix_tokens)
            ask = f"What is the special magic number for {ex.meta['city']}?"
            assert suffix.count(ask) == 1 and suffix.endswith(f"The special magic number for {ex.meta['city']} is")
            turn = suffix[: suffix.rindex("<|im_end|>")]  # the last user turn, before the assistant header
            where.setdefault(name, []).append(turn.index(ask) / len(turn))
    assert max(where["multiturn-qbegin"]) < 0.2 < min(where["multiturn-qmiddle"]) <= max(where["multiturn-qmiddle"]) < 0.8
    assert min(where["multiturn-qend"]) > 0.8
    with pytest.raises(ValueError, match="question_at must be one of begin, middle, end"):
        text.multiturn.example(tok, 1, 700, question_at="top")


@pytest.mark.skipif(not zoo.installed("gemma3-270m"), reason=f"needs {zoo.MODELS['gemma3-270m'].install_command}")
def test_a_model_that_expects_bos_gets_it_first_and_the_needle_spans_follow(tmp_path):
    gemma = zoo.load("gemma3-270m").tokenizer  # add_bos_token: Gemma expects <bos> before a prompt
    for task in ("passkey", "niah"):
        (ex,) = text.examples(task, gemma, 1, 700)
        assert ex.prefix_tokens[0] == gemma.bos_token_id and gemma.bos_token_id not in ex.prefix_tokens[1:]
        assert all(answer in gemma.decode(ex.prefix_tokens[s:e]) for s, e in ex.needle_spans for answer in ex.answers)
    path = tmp_path / "t.jsonl"
    path.write_text(
        json.dumps(
            {
                "prefix": "Some prose. The code is 4821. More prose.",
                "needle": "The code is 4821.",
                "question": " Code?",
                "answers": ["4821"],
            }
        )
        + "\n"
    )
    (ex,) = jsonl.examples(str(path), gemma, 1)
    (s, e) = ex.needle_spans[0]
    assert ex.prefix_tokens[0] == gemma.bos_token_id and "4821" in gemma.decode(ex.prefix_tokens[s:e])

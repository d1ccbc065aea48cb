"""The synthetic recall tasks: seeded, exact lengths, answers right by construction, question positions varied."""

import numpy as np
import pytest

from kvstore_tools import tasks
from kvstore_tools.tasks import fewshot, kv_retrieval, multiturn
from kvstore_tools.tasks import vocab as V

TASK_NAMES = list(tasks.TASKS)


def _records(tokens: np.ndarray) -> dict[int, list[tuple[int, int]]]:
    """key -> [(value, position of REC)] for every ``REC key value`` in ``tokens``."""
    out: dict[int, list[tuple[int, int]]] = {}
    for i in np.flatnonzero(tokens[:-2] == V.REC):
        out.setdefault(int(tokens[i + 1]), []).append((int(tokens[i + 2]), int(i)))
    return out


@pytest.mark.parametrize("task", TASK_NAMES)
def test_same_seed_same_examples_other_seed_or_purpose_differs(task):
    a = tasks.examples(task, 3, 700, seed=5)
    b = tasks.examples(task, 3, 700, seed=5)
    c = tasks.examples(task, 3, 700, seed=6)
    for x, y in zip(a, b):
        assert np.array_equal(x.prefix, y.prefix) and np.array_equal(x.suffix, y.suffix)
        assert (x.answer, x.answer_spans, x.meta) == (y.answer, y.answer_spans, y.meta)
    assert not all(np.array_equal(x.prefix, z.prefix) for x, z in zip(a, c))
    module = tasks.get_task(task)
    train = module.training_sequence(tasks.rng_for("train", 5, task), 700).tokens
    again = module.training_sequence(tasks.rng_for("train", 5, task), 700).tokens
    held_out = module.example(tasks.rng_for("eval", 5, task), 700).prefix
    assert np.array_equal(train, again)
    assert not np.array_equal(train[: held_out.size], held_out)


@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("num_tokens", [300, 1001, 2048])
def test_examples_have_the_requested_length_and_vocabulary(task, num_tokens):
    for ex in tasks.examples(task, 4, num_tokens, seed=1):
        assert ex.task == task
        assert ex.prefix.size + ex.suffix.size == num_tokens
        assert ex.prefix[0] == V.BOS and ex.prefix.dtype == ex.suffix.dtype == np.int64
        both = np.concatenate([ex.prefix, ex.suffix])
        assert both.min() >= 0 and both.max() < V.VOCAB_SIZE
        assert ex.answer in V.VALUES


def test_kv_answer_is_the_value_of_the_queried_key():
    for ex in tasks.examples("kv", 20, 2048, seed=2):
        assert ex.suffix.tolist()[0] == V.QUERY
        key = int(ex.suffix[-1])
        records = _records(ex.prefix)
        assert records[key] == [(ex.answer, ex.answer_spans[0][0])]  # stated once, where the span says
        ((start, end),) = ex.answer_spans
        assert ex.prefix[start:end].tolist() == [V.REC, key, ex.answer]
        assert len(records) == ex.meta["num_records"]


def test_kv_record_count_varies_with_length():
    short = [ex.meta["num_records"] for ex in tasks.examples("kv", 20, 512, seed=3)]
    long = [ex.meta["num_records"] for ex in tasks.examples("kv", 20, 2048, seed=3)]
    assert len(set(short)) > 5 and len(set(long)) > 5
    assert np.mean(long) > 2 * np.mean(short)


def test_drop_answer_removes_the_only_statement_of_the_answer():
    for task in ("kv", "multiturn"):
        for ex in tasks.examples(task, 10, 1024, seed=4):
            if not ex.answer_spans:
                continue
            keep = np.ones(ex.prefix.size, dtype=bool)
            for c in ex.answer_chunks(16):
                keep[16 * c : 16 * (c + 1)] = False
            for start, end in ex.answer_spans:
                assert not keep[start:end].any()
            key = int(ex.suffix[np.flatnonzero(ex.suffix == V.QUERY)[0] + 1])
            masked = np.where(keep, ex.prefix, V.PAD)
            assert key not in _records(masked)


def test_answer_chunks_cover_spans_across_chunk_borders():
    ex = tasks.Example("kv", np.zeros(64, np.int64), np.zeros(2, np.int64), 0, ((14, 17), (40, 41)))
    assert ex.answer_chunks(16).tolist() == [0, 1, 2]
    assert tasks.Example("kv", np.zeros(8, np.int64), np.zeros(1, np.int64), 0, ()).answer_chunks(16).size == 0


def test_multiturn_answer_and_question_placement():
    seen_positions, seen_same = set(), set()
    for ex in tasks.examples("multiturn", 60, 2048, seed=5):
        suffix = ex.suffix
        assert suffix[0] == V.USER and suffix[-1] == V.ASSISTANT
        q = int(np.flatnonzero(suffix == V.QUERY)[0])
        key = int(suffix[q + 1])
        recs_prefix, recs_suffix = _records(ex.prefix), _records(suffix)
        assert len(recs_prefix.get(key, [])) + len(recs_suffix.get(key, [])) == 1  # keys are stated once
        rec_positions = np.flatnonzero(suffix == V.REC)
        position = ex.meta["question_position"]
        seen_positions.add(position)
        seen_same.add(ex.meta["same_turn"])
        if position == "before":
            assert q < rec_positions.min()
        elif position == "after":
            assert q > rec_positions.max()
        else:
            assert rec_positions.min() < q < rec_positions.max()
        if ex.meta["same_turn"]:
            assert ex.answer_spans == ()
            value, where = recs_suffix[key][0]
            assert where < q and value == ex.answer
        else:
            ((start, end),) = ex.answer_spans
            assert ex.prefix[start:end].tolist() == [V.REC, key, ex.answer]
        # the history carries the assistant's answers, and none re-asks this key
        assert (ex.prefix == V.ASSISTANT).sum() == ex.meta["num_turns"] - 1
        asked = ex.prefix[np.flatnonzero(ex.prefix[:-1] == V.QUERY) + 1]
        assert key not in asked.tolist()
        assert ex.meta["num_turns"] >= 3
    assert seen_positions == {"before", "middle", "after"}
    assert seen_same == {True, False}


def test_fewshot_labels_follow_one_hidden_rule():
    positions = set()
    for ex in tasks.examples("fewshot", 20, 1024, seed=6):
        j = ex.meta["rule_position"]
        positions.add(j)
        rows = ex.prefix[ex.prefix.size - ex.meta["num_examples"] * fewshot.EXAMPLE_TOKENS :].reshape(-1, fewshot.EXAMPLE_TOKENS)
        assert (rows[:, 0] == V.EXAMPLE).all() and (rows[:, -2] == V.LABEL).all()
        rule = {}
        for row in rows:
            assert rule.setdefault(int(row[1 + j]), int(row[-1])) == int(row[-1])  # a function of x_j
        assert ex.suffix.tolist()[0] == V.EXAMPLE and ex.suffix[-1] == V.LABEL
        query = int(ex.suffix[1 + j])
        assert rule[query] == ex.answer
        evidence = [(s, e) for s, e in ex.answer_spans]
        assert len(evidence) == ex.meta["evidence"] >= 1
        for s, e in evidence:
            assert ex.prefix[s + 1 + j] == query and ex.prefix[e - 1] == ex.answer
        assert len(evidence) == int((rows[:, 1 + j] == query).sum())
    assert positions == {0, 1, 2}


@pytest.mark.parametrize("task", TASK_NAMES)
@pytest.mark.parametrize("num_tokens", [256, 2048])
def test_training_sequences_supervise_the_answers(task, num_tokens):
    rng = tasks.rng_for("train", 0, task)
    module = tasks.get_task(task)
    for _ in range(3):
        seq = module.training_sequence(rng, num_tokens)
        toks, pos = seq.tokens, seq.answer_positions
        assert toks.size == num_tokens and pos.size >= 1 and pos.max() < num_tokens - 1
        targets = toks[pos + 1]
        assert np.isin(targets, V.VALUES).all()
        if task == "kv":
            records = _records(toks)
            assert all(records[int(toks[p])][0][0] == toks[p + 1] for p in pos)
            assert pos.size >= num_tokens // 32 - 1
        elif task == "multiturn":
            assert (toks[pos] == V.ASSISTANT).all()
        else:
            assert (toks[pos] == V.LABEL).all()


def test_rng_for_rejects_unknown_purpose_and_task():
    with pytest.raises(ValueError):
        tasks.rng_for("test", 0)
    with pytest.raises(ValueError):
        tasks.get_task("nope")
    assert kv_retrieval.NAME in tasks.TASKS and multiturn.NAME in tasks.TASKS

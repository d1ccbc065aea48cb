"""The prose questions written as a ``file:`` task: each record's evidence is one sentence of the
reference, the prefix holds it with the prose around it, fills the budget, and reads back through
the ``file:`` task's checks; the answers are read from the evidence, not from the question."""

import json
import sys

import pytest
from pretrained import needs_smollm2

from engine_client.model import zoo
from kvstore_tools.tasks import text
from kvstore_tools.tasks.text import haystack, jsonl, prose_file
from kvstore_tools.tasks.text.base import answer_in

pytestmark = [
    needs_smollm2,
    pytest.mark.skipif(
        sys.version_info[:2] != (3, 11), reason="the questions quote the Python 3.11 reference; other versions word it differently"
    ),
]


@pytest.fixture(scope="module")
def tok():
    return zoo.load("smollm2-135m").tokenizer


def test_every_question_quotes_one_sentence_that_holds_its_answers():
    text_ = haystack.sentences()
    seen = set()
    for q in prose_file.QUESTIONS:
        i = prose_file.evidence_index(q, text_)
        assert i not in seen  # no two questions on one sentence
        seen.add(i)
        assert any(answer_in(a, text_[i]) for a in q.answers), q.question
        assert not any(answer_in(a, q.question) for a in q.answers), q.question


@pytest.mark.parametrize("tokens", [512, 2048])
def test_records_fill_the_budget_around_the_evidence_and_read_back_as_a_file_task(tmp_path, tok, tokens):
    rows = prose_file.records(tok, tokens)
    assert len(rows) == len(prose_file.QUESTIONS)
    path = tmp_path / "prose.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    examples = text.examples(f"file:{path}", tok, len(rows), tokens)
    depths = []
    for row, ex in zip(rows, examples):
        assert row["prefix"].startswith(prose_file.HEADER) and row["prefix"].count(row["needle"]) == 1
        assert tokens - 80 <= ex.num_prefix_tokens <= tokens
        span = ex.needle_spans[0]
        assert row["needle"].split()[0] in tok.decode(ex.prefix_tokens[span[0] : span[1]])
        depths.append(ex.depth)
    assert min(depths) < 0.3 and max(depths) > 0.7  # drawn per question, not all at one place
    assert rows == prose_file.records(tok, tokens)  # the same file each time
    other = prose_file.records(tok, tokens, seed_base=1000)  # another depth stream: same questions, other places
    assert [r["question"] for r in other] == [r["question"] for r in rows] and other != rows


def test_the_sentences_around_the_evidence_are_the_references_own_order(tok):
    rows = prose_file.records(tok, 512)
    text_ = haystack.sentences()
    for q, row in zip(prose_file.QUESTIONS, rows):
        i = prose_file.evidence_index(q, text_)
        body = row["prefix"][len(prose_file.HEADER) :]
        at = body.index(row["needle"])
        if at > 0:
            assert body[:at].rstrip().endswith(text_[i - 1].strip())
        rest = body[at + len(row["needle"]) :]
        if rest:
            assert rest.startswith(text_[(i + 1) % len(text_)])


def test_refusals_name_the_question_or_the_budget(tok):
    bad = prose_file.Question("no such sentence in the reference", " What? It is", "x")
    with pytest.raises(prose_file.ProseFileError, match="no sentence.*no such sentence"):
        prose_file.evidence_index(bad, haystack.sentences())
    with pytest.raises(prose_file.ProseFileError, match="--tokens 40 cannot hold"):
        prose_file.record(prose_file.QUESTIONS[0], tok, 40, 0.5, haystack.sentences())
    with pytest.raises(prose_file.ProseFileError, match="--tokens 1000000"):
        prose_file.records(tok, 1_000_000)


def test_cli_writes_the_file_and_refuses_in_one_line(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert prose_file.main(["--model", "smollm2-135m", "--tokens", "512", "--out", str(out)]) == 0
    assert len(jsonl.read(str(out))) == len(prose_file.QUESTIONS)
    assert "wrote 40 questions" in capsys.readouterr().out
    assert prose_file.main(["--model", "no-such-model", "--tokens", "512", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown model 'no-such-model'") and "\n" not in err
    assert prose_file.main(["--model", "smollm2-135m", "--tokens", "512", "--out", str(tmp_path / "no" / "p.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out ") and "No such file or directory" in err and "\n" not in err
    for bad in (["--tokens", "10"], ["--tokens", "512", "--seed-base", "-1"]):
        with pytest.raises(SystemExit):
            prose_file.main([*bad, "--out", str(out)])


def test_dotted_versions_are_scored_as_whole_numbers():
    assert answer_in("3.11", " 3.11. The version") and answer_in("3.1", "(3.1)")
    assert not answer_in("3.11", " 3.11.4") and not answer_in("3.1", " 3.11") and not answer_in("3.1", " 13.1")

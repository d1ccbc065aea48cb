"""Questions over real prose, written as a ``file:`` task.

Every question is about one sentence of the Python Language Reference (the
haystack, ``haystack.py``): what version changed something, which special
method or attribute a passage names, what is raised when.  The prefix is
that sentence with the prose around it as the reference has it (the
sentences before and after it, in order), so the evidence is an ordinary
sentence of the document among others of the same section (neighbouring
"Changed in version" notes, other special methods), not an inserted needle.
Each question's depth in its prefix is drawn from a seed per question.

    python -m kvstore_tools.tasks.text.prose_file --model gemma3-270m --tokens 2048 --out prose-2048.jsonl
    kvstore-bench accuracy --model gemma3-270m --task file:prose-2048.jsonl --tokens 2048 --examples 40 ...

The file is written for one model's tokenizer (each prefix fills ``--tokens``
of it, to the last whole sentence) and from the running interpreter's
haystack: a question whose sentence that interpreter's reference words
differently is refused, naming it.  ``needle`` is the evidence sentence, so
``drop-needle`` tells how much of the answer the model reads from it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np

from .base import bos_ids, task_rng
from .haystack import haystack_source, sentences

NAME = "prose-file"
HEADER = "The following text is taken from the Python Language Reference. Read it; a question about it follows.\n"
MAX_NEW_TOKENS = 10


@dataclass(frozen=True)
class Question:
    evidence: str  # a substring of exactly one haystack sentence
    question: str  # the suffix: a statement that stops where the answer starts
    answers: tuple[str, ...]


def _q(evidence: str, question: str, *answers: str) -> Question:
    return Question(evidence, question, answers)


QUESTIONS: tuple[Question, ...] = (
    # "Changed in version" / "New in version" notes: the number is read from the text.
    _q(
        "Changed in version 3.11: Starred elements are now allowed in the expression list.",
        " Starred elements were first allowed in the expression list in version",
        "3.11",
    ),
    _q("Changed in version 3.8: Prior to Python 3.8", ' A "continue" statement became legal in the "finally" clause in version', "3.8"),
    _q('New in version 3.7: The built-in "breakpoint()"', ' The built-in "breakpoint()" was new in version', "3.7"),
    _q(
        'Changed in version 3.3: Tab-completion via the "readline" module',
        ' Tab-completion via the "readline" module came in version',
        "3.3",
    ),
    _q('New in version 3.2: "-c" option is introduced', ' The "-c" option was introduced in version', "3.2"),
    _q('New in version 3.7: "-m" option is introduced', ' The "-m" option was introduced in version', "3.7"),
    _q(
        'Changed in version 3.11: ".pdbrc" is now read with "\'utf-8\'" encoding.',
        ' ".pdbrc" has been read with "\'utf-8\'" encoding since version',
        "3.11",
    ),
    _q(
        'Changed in version 3.2: ".pdbrc" can now contain commands that continue debugging',
        ' ".pdbrc" can contain commands that continue debugging since version',
        "3.2",
    ),
    _q("New in version 3.5: Unpacking into dictionary displays", " Unpacking into dictionary displays was new in version", "3.5"),
    _q(
        'Changed in version 3.1: The positional argument specifiers can be omitted for "str.format()"',
        ' The positional argument specifiers can be omitted for "str.format()" since version',
        "3.1",
    ),
    _q(
        'Changed in version 3.4: The positional argument specifiers can be omitted for "Formatter".',
        ' The positional argument specifiers can be omitted for "Formatter" since version',
        "3.4",
    ),
    _q(
        "Changed in version 3.10: Preceding the *width* field",
        " Preceding the *width* field by \"'0'\" no longer affects the default alignment for strings since version",
        "3.10",
    ),
    _q('New in version 3.3: The "__suppress_context__" attribute', ' The "__suppress_context__" attribute was new in version', "3.3"),
    _q(
        "New in version 3.3: The \"'rb'\" prefix of raw bytes literals",
        " The \"'rb'\" prefix of raw bytes literals was added in version",
        "3.3",
    ),
    _q(
        'Changed in version 3.6: Unrecognized escape sequences produce a "DeprecationWarning".',
        ' Unrecognized escape sequences produce a "DeprecationWarning" since version',
        "3.6",
    ),
    _q(
        'Changed in version 3.9: Evaluating "NotImplemented" in a boolean context is deprecated.',
        ' Evaluating "NotImplemented" in a boolean context is deprecated since version',
        "3.9",
    ),
    _q(
        "Changed in version 3.7: Traceback objects can now be explicitly instantiated",
        " Traceback objects can be explicitly instantiated from Python code since version",
        "3.7",
    ),
    _q(
        "Changed in version 3.3: Define ‘==’ and ‘!=’ to compare range objects",
        " Range objects are compared with ‘==’ and ‘!=’ by the sequence of values they define since version",
        "3.3",
    ),
    _q("Changed in version 3.2: Implement the Sequence ABC.", " Range objects implement the Sequence ABC since version", "3.2"),
    # Names a passage gives: the special method, attribute or exception it says.
    _q(
        'This operation can be customized using the special "__mul__()"',
        " The multiplication operation can be customized using the special method",
        "__mul__",
    ),
    _q(
        'This operation can be customized using the special "__truediv__()"',
        " The division operation can be customized using the special method",
        "__truediv__",
    ),
    _q(
        'This operation can be customized using the special "__add__()"',
        " The addition operation can be customized using the special method",
        "__add__",
    ),
    _q(
        'This operation can be customized using the special "__lshift__()"',
        " The shifting operations can be customized using the special method",
        "__lshift__",
    ),
    _q('custom object overriding "__xor__()"', ' For the "^" operator, a custom object overrides the special method', "__xor__"),
    _q(
        'the operation can be overridden with the "__neg__()" special method.',
        ' The unary "-" (minus) operator can be overridden with the special method',
        "__neg__",
    ),
    _q(
        'the operation can be overridden with the "__pos__()" special method.',
        ' The unary "+" (plus) operator can be overridden with the special method',
        "__pos__",
    ),
    _q(
        'User-defined objects can customize their truth value by providing a "__bool__()" method.',
        " User-defined objects can customize their truth value by providing the method",
        "__bool__",
    ),
    _q(
        'Instances of arbitrary classes can be made callable by defining a "__call__()" method',
        " Instances of arbitrary classes can be made callable by defining the method",
        "__call__",
    ),
    _q(
        'can be extracted from function objects through their "__code__" attribute.',
        " Code objects can be extracted from function objects through their attribute",
        "__code__",
    ),
    _q(
        'attached to it as the "__traceback__" attribute, which is writable.',
        " A traceback object is attached to a raised exception as the attribute",
        "__traceback__",
    ),
    _q(
        'it will be attached to the raised exception as the "__cause__" attribute (which is writable).',
        " An exception instance given as the second expression is attached to the raised exception as the attribute",
        "__cause__",
    ),
    _q(
        'The new method’s "__func__" attribute is the original function object.',
        " The original function object of a method is its attribute",
        "__func__",
    ),
    _q('"f_lineno" is the current line number of the frame', " The current line number of the frame is the attribute", "f_lineno"),
    _q(
        'Special writable attribute: "tb_next" is the next level in the stack trace',
        " The next level in the stack trace is the traceback attribute",
        "tb_next",
    ),
    _q(
        'a "RuntimeError" exception is raised indicating that this is an error.',
        ' If there is no active exception, a bare "raise" raises the exception',
        "RuntimeError",
    ),
    _q("the next 11 lines are listed.", ' If the last command was a "list" command, a blank line lists the next', "11"),
    _q(
        "based on the Unicode standard annex UAX-31",
        " The syntax of identifiers in Python is based on the Unicode standard annex",
        "UAX-31",
        "UAX 31",
    ),
    _q(
        'The only feature that requires using the future statement is "annotations"',
        " The only feature that requires using the future statement is",
        "annotations",
    ),
    _q(
        'the first item in "co_consts" is the documentation string of the function',
        ' For a function, the first item in "co_consts" is the',
        "documentation string",
        "docstring",
    ),
    _q('"id(x)" is the memory address where "x" is stored.', ' For CPython, "id(x)" is the', "memory address"),
)


class ProseFileError(ValueError):
    """A prose task that cannot be written: the message names the question or the argument."""


def evidence_index(q: Question, text: tuple[str, ...]) -> int:
    """The one haystack sentence that holds ``q.evidence``."""
    hits = [i for i, s in enumerate(text) if q.evidence in s]
    if len(hits) != 1:
        found = "no sentence" if not hits else f"{len(hits)} sentences"
        raise ProseFileError(f"question {q.question.strip()!r}: {found} of {haystack_source()} hold its evidence {q.evidence!r}")
    return hits[0]


def record(q: Question, tokenizer, num_tokens: int, depth: float, text: tuple[str, ...]) -> dict:
    """One JSONL record: ``HEADER``, the prose before the evidence sentence (about ``depth`` of the
    room), the sentence, the prose after it, at most ``num_tokens`` tokens in all."""

    def count(s: str) -> int:
        return len(tokenizer.backend.encode(s, add_special_tokens=False).ids)

    e = evidence_index(q, text)
    room = num_tokens - bos_ids(tokenizer).size - count(HEADER) - count(text[e]) - 4  # 4: joins tokenized apart
    if room <= 0:
        raise ProseFileError(f"--tokens {num_tokens} cannot hold the header and the evidence sentence")
    before, used = [], 0
    for k in range(1, len(text)):
        n = count(text[(e - k) % len(text)])
        if used + n > depth * room:
            break
        before.insert(0, text[(e - k) % len(text)])
        used += n
    after = []
    for k in range(1, len(text) - len(before)):
        n = count(text[(e + k) % len(text)])
        if used + n > room:
            break
        after.append(text[(e + k) % len(text)])
        used += n
    return {
        "prefix": HEADER + "".join([*before, text[e], *after]).lstrip(),
        "question": q.question,
        "answers": list(q.answers),
        "needle": text[e].strip(),
        "max_new_tokens": MAX_NEW_TOKENS,
    }


def records(tokenizer, num_tokens: int, *, seed_base: int = 0) -> list[dict]:
    """Every question's record; question ``i``'s depth is drawn from seed ``seed_base + i``."""
    text = sentences()
    limit = sum(len(tokenizer.backend.encode(s, add_special_tokens=False).ids) for s in text) // 2
    if num_tokens > limit:
        raise ProseFileError(f"--tokens {num_tokens}: the haystack holds about {2 * limit} tokens; at most {limit} per prefix")
    out = []
    for i, q in enumerate(QUESTIONS):
        depth = float(task_rng(NAME, seed_base + i).uniform(0.0, 1.0))
        out.append(record(q, tokenizer, num_tokens, depth, text))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvstore_tools.tasks.text.prose_file",
        description="Write the prose questions over the Python Language Reference as a JSONL file: task file:PATH.",
    )
    p.add_argument("--model", default="gemma3-270m", help="the model whose tokenizer counts --tokens (default gemma3-270m)")
    p.add_argument("--tokens", type=int, required=True, help="tokens per prefix, at most")
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument(
        "--seed-base", type=int, default=0, help="question i's depth is drawn from seed SEED_BASE + i (default 0: the evaluation file)"
    )
    args = p.parse_args(argv)
    if args.tokens < 64:
        p.error("--tokens must be at least 64")
    if args.seed_base < 0:
        p.error("--seed-base must be >= 0")
    from engine_client.model import zoo
    from engine_client.model.tokenizer import Tokenizer

    try:
        tokenizer = Tokenizer.load(zoo.cached_checkpoint(args.model))
        rows = records(tokenizer, args.tokens, seed_base=args.seed_base)
    except (ProseFileError, zoo.UnknownModel, zoo.ModelNotInstalled, zoo.CorruptModelFile) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    except OSError as exc:
        print(f"error: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    depths = [r["prefix"].index(r["needle"]) / len(r["prefix"]) for r in rows]
    print(
        f"wrote {len(rows)} questions, {args.tokens} tokens of {args.model} each at most, "
        f"evidence at depths {np.min(depths):.2f}-{np.max(depths):.2f}, from {haystack_source()}: {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

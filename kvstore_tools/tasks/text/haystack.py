"""Natural English prose available offline: the Python Language Reference shipped with CPython.

The haystack is ``pydoc_data/topics.py`` of the running interpreter's
standard library (the text ``help()`` shows: the Language Reference's
sections on statements, expressions, data model, ...), licensed under the
Python Software Foundation License Version 2 (the interpreter's own licence).
Every Python installation has it, so the tasks need no download and no
package beyond the interpreter.  Its wording changes between Python versions,
so an example's tokens depend on the interpreter's minor version (the
``source`` field of ``haystack_source()`` records it).

Only prose is kept: paragraphs of unindented lines, without grammar rules,
interactive sessions or headings, split into sentences.
"""

from __future__ import annotations

import functools
import re
import sys

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")


def haystack_source() -> str:
    return f"pydoc_data/topics.py of Python {sys.version_info.major}.{sys.version_info.minor} (PSF License Version 2)"


def _prose_paragraphs(text: str):
    for para in re.split(r"\n\s*\n", text):
        lines = para.split("\n")
        if not lines or any(not ln or ln[0].isspace() for ln in lines):
            continue  # code, grammar, indented notes, tables
        joined = " ".join(ln.strip() for ln in lines)
        if len(joined) < 80 or "::=" in joined or ">>>" in joined or re.fullmatch(r"[*=\-~^ ]+", lines[-1]):
            continue
        if joined.count('"') > 6 or not joined.rstrip().endswith((".", ":")):
            continue  # mostly identifiers, or cut before a code block
        yield joined


@functools.lru_cache(maxsize=1)
def sentences() -> tuple[str, ...]:
    """The prose sentences of the haystack, in a fixed order (topics sorted by name), each with a leading space."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        for para in _prose_paragraphs(topics[name]):
            for s in _SENTENCE_END.split(para):
                s = s.strip()
                if 20 <= len(s) <= 400 and s.endswith("."):
                    out.append(" " + s)
    return tuple(out)

"""Build a safe FTS5 MATCH expression from any user text.

Every token is double-quoted, so FTS5 operators (`NEAR(`, `*`, `^`, `AND`, column
filters, unbalanced quotes) in user text are matched as plain words and can never
raise a syntax error. Stop-words are dropped because an OR of very common words
scans most of the index (about 400 ms at 300k messages, measured).

Chinese, Japanese and Korean runs become their character bigrams, then (after every other
term, so a long question drops them first) their characters that are not stop-words: the
terms the indexes hold for them (memory/search/cjk.py).
"""

from __future__ import annotations

import re
from collections.abc import Collection

from speakermem.memory.search.cjk import bigrams, is_cjk_run, split_runs
from speakermem.memory.search.stopwords import CJK_STOPWORDS, STOPWORDS

_TOKEN = re.compile(r"\w+", re.UNICODE)
MAX_TERMS = 32


def query_terms(text: str, *, max_terms: int = MAX_TERMS, unigrams: bool = True) -> list[str]:
    """Distinct lowercase content words of `text`, in order, stop-words removed; CJK runs
    as their bigrams, and (`unigrams`) their content characters last."""
    seen: dict[str, None] = {}
    chars: dict[str, None] = {}
    for raw in _TOKEN.findall(split_runs(text.casefold())):
        token = raw.strip("_")
        if not token:
            continue
        if is_cjk_run(token):
            for gram in bigrams(token):
                if len(gram) == 1 and gram in CJK_STOPWORDS:
                    continue
                (seen if len(gram) > 1 else chars).setdefault(gram, None)
            if unigrams and len(token) > 1:
                chars.update(dict.fromkeys(c for c in token if c not in CJK_STOPWORDS))
            continue
        if token in STOPWORDS or token in seen:
            continue
        if len(token) == 1 and not token.isdigit():
            continue
        seen[token] = None
        if len(seen) >= max_terms:
            break  # the characters come after every word and bigram: none would be kept
    terms = list(seen) + [c for c in chars if c not in seen]
    return terms[:max_terms]


def quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def build_match(
    text: str,
    *,
    max_terms: int = MAX_TERMS,
    extra: list[str] | None = None,
    text_only: Collection[str] = (),
) -> str:
    """An OR-query of the quoted content words of `text` (plus `extra` terms); '' if none.

    Terms in `text_only` (people's names) match the message text only, not the speaker
    column: a name there would match every message its owner wrote.
    """
    terms = query_terms(text, max_terms=max_terms)
    for term in extra or []:
        for t in query_terms(term):
            if t not in terms:
                terms.append(t)
    return " OR ".join("{text} : " + quote(t) if t in text_only else quote(t) for t in terms)

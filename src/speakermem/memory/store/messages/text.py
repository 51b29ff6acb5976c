"""How a message's words meet the indexes: the text the dense index embeds, and a display
name as a full-text phrase."""

from __future__ import annotations

import re

from speakermem.memory.search.cjk import has_cjk, phrase_form
from speakermem.memory.search.fts_query import quote

_NAME_TOKEN = re.compile(r"[^\W_]", re.UNICODE)


def speaker_phrase(name: str) -> str:
    """An FTS5 phrase matching a display name in the speaker column ('' if it has no word).

    The whole name is quoted, so FTS5 tokenizes it exactly as it tokenized the column:
    stop-words and one-letter parts ("Girl's Voice", "j_doe") stay in the phrase. The
    query tokenizer drops them, and its phrase then matched none of the speaker's rows.
    CJK runs are written as the index holds them (their bigrams, memory/search/cjk.py).
    """
    name = " ".join(phrase_form(name).split())
    return quote(name) if _NAME_TOKEN.search(name) else ""


def embed_text(speaker_name: str, text: str) -> str:
    """What the dense index embeds: the speaker's name with the text, so 'who said' matches."""
    return f"{speaker_name}: {text}"


def name_pattern(word: str) -> re.Pattern[str]:
    """`word` (a name or one of its parts) as written in a message, any case."""
    return re.compile(
        r"(?<!\w)" + r"\s+".join(map(re.escape, word.split())) + r"(?!\w)", re.IGNORECASE
    )


def count_lowercase(word: str, texts: list[str]) -> tuple[int, float]:
    """(occurrences of `word` in `texts`, the share of them written in lower case).

    A word without case (李伟, リナ) is never seen written in lower case: (0, 0.0)."""
    if has_cjk(word) and word.lower() == word.upper():
        return 0, 0.0
    pattern = name_pattern(word)
    seen = lower = 0
    for text in texts:
        for m in pattern.finditer(text):
            seen += 1
            lower += m.group(0) == m.group(0).lower()
    return seen, (lower / seen if seen else 0.0)

"""Chinese, Japanese and Korean text as character n-grams for the lexical indexes.

These scripts write words without spaces, so FTS5's unicode61 tokenizer and PostgreSQL's
parser keep a whole run of them ("下周发布计划") as one token that no query word matches.
`index_text` rewrites a text into what both backends index: each CJK run becomes its
character bigrams in order (a run of one character stays itself), and the characters of the
longer runs follow at the end of the text, so a word of one character is found too. The
bigrams stay contiguous and in order, so a phrase of several CJK characters is the phrase of
its bigrams (`phrase_form`), and words outside CJK keep their positions' order. CJK
punctuation becomes a space (unicode61 drops it; PostgreSQL's parser would keep it).

SQLite indexes `index_text(...)` through the function `speakermem_segment` registered on each
connection; PostgreSQL through the SQL function of the same name
(memory/store/pg/cjk_index.py), which computes the same text (a parity test holds them
together). Text without CJK is returned unchanged, so English indexes and rankings do not
move.

Thai, Lao, Khmer and Burmese also write without spaces but are not segmented here: a run is
one token, found only when the query holds the same whole run.
"""

from __future__ import annotations

import re

from anyascii import anyascii

CJK_RANGES = (
    "\u1100-\u11ff"  # Hangul Jamo
    "\u3005"  # 々, the ideographic iteration mark (人々)
    "\u3041-\u309f"  # Hiragana
    "\u30a1-\u30fa\u30fc-\u30ff"  # Katakana, without the middle dot
    "\u3131-\u318e"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK Ext A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uac00-\ud7a3"  # Hangul syllables
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uff66-\uff9f"  # Halfwidth Katakana
    "\U00020000-\U0002fa1f"  # CJK Ext B-F, compatibility supplement
)
"""The characters indexed as n-grams (a regular expression bracket's contents)."""

CJK_PUNCT_RANGES = (
    "\u3000-\u3004\u3008-\u3020"  # ideographic space, 、。, brackets 「」『』【】
    "\u30fb"  # ・
    "\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65"  # fullwidth ！，．：？ etc.
)
"""CJK punctuation, a space in the indexed text."""

LATIN_WORD_CHAR = f"[^\\W{CJK_RANGES}]"
"""A word character outside CJK (a regular expression): a name's boundary. CJK writes names
inside runs of other words ("李伟说"), so a CJK neighbour does not make a name part of a
longer word."""

_RUN = re.compile(f"[{CJK_RANGES}]+")
_ANY = re.compile(f"[{CJK_RANGES}{CJK_PUNCT_RANGES}]")
_PUNCT = re.compile(f"[{CJK_PUNCT_RANGES}]")


def has_cjk(text: str) -> bool:
    return _RUN.search(text) is not None


def bigrams(run: str) -> list[str]:
    """A CJK run's character bigrams in order; a run of one character is itself."""
    if len(run) < 2:
        return [run] if run else []
    return [run[i : i + 2] for i in range(len(run) - 1)]


def index_text(text: str) -> str:
    """What the full-text indexes hold for `text` (see the module docstring)."""
    if not text or _ANY.search(text) is None:
        return text
    unigrams: list[str] = []

    def run(m: re.Match[str]) -> str:
        chars = m.group()
        if len(chars) > 1:
            unigrams.extend(chars)
        return " " + " ".join(bigrams(chars)) + " "

    body = _RUN.sub(run, _PUNCT.sub(" ", text))
    return body + " " + " ".join(unigrams) if unigrams else body


def phrase_form(text: str) -> str:
    """A phrase as the index holds it: each CJK run as its bigrams in order, so the quoted
    result matches where `text` occurs inside an indexed text (on both backends)."""
    if not text or _ANY.search(text) is None:
        return text
    return _RUN.sub(lambda m: " " + " ".join(bigrams(m.group())) + " ", _PUNCT.sub(" ", text))


def runs(text: str) -> list[str]:
    """The CJK runs of `text`, in order."""
    return _RUN.findall(text)


def split_runs(text: str) -> str:
    """`text` with a space on either side of each CJK run ("release发布" -> "release 发布 "),
    so a word tokenizer sees CJK runs apart from the Latin words glued to them."""
    if _RUN.search(text) is None:
        return text
    return _RUN.sub(lambda m: f" {m.group()} ", text)


def is_cjk_run(token: str) -> bool:
    return _RUN.fullmatch(token) is not None


_WORD_OR_RUN = re.compile(f"[a-z0-9]+|[{CJK_RANGES}]+")


def words_and_runs(text: str) -> list[str]:
    """Lowercased ASCII alphanumeric words and whole CJK runs, in order: the comparison
    tokens of the Writer and the evaluation, which knew only `[a-z0-9]+` (and so saw nothing
    in a Chinese message)."""
    return _WORD_OR_RUN.findall(text.lower())


def words_and_ngrams(text: str, *, unigrams: bool = True) -> list[str]:
    """`words_and_runs` with each CJK run as its bigrams (and, with `unigrams`, then its
    characters): BM25's and the evidence gate's terms."""
    out: list[str] = []
    for token in words_and_runs(text):
        if is_cjk_run(token):
            out.extend(ngram_tokens(token) if unigrams else bigrams(token))
        else:
            out.append(token)
    return out


def ngram_tokens(run: str) -> list[str]:
    """A CJK run's bigrams then its unigrams (the BM25 terms of the run: the standard CJK
    baseline's unigrams and bigrams)."""
    if len(run) < 2:
        return [run] if run else []
    return bigrams(run) + list(run)


_SYLLABLE = re.compile(
    "[\u1100-\u11ff\u3131-\u318e\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7a3\uf900-\ufaff]"
)
"""Han and Hangul: one character, one romanised syllable."""


def romanised(name: str) -> str | None:
    """A CJK name in Latin letters, syllables apart ("李伟" -> "Li Wei", "민준" -> "Min Jun",
    "さくら" -> "sakura"), so people who type it that way name the same member; None for a
    name without CJK. Han characters are read in Mandarin (a Japanese name in kanji gets its
    Chinese reading, which nobody types: harmless, but no help)."""
    if not has_cjk(name):
        return None
    out = "".join(f" {anyascii(c)} " if _SYLLABLE.match(c) else anyascii(c) for c in name)
    return " ".join(out.split()) or None

"""How SQLite's FTS5 could index Chinese, Japanese and Korean: the three ways measured.

    python bench/bench_cjk_fts.py tests/fixtures/cjk_group_chats.json \
        --english ../shared/data/locomo/locomo-dev.json --json docs/benchmarks/cjk-fts.json

Each way indexes the messages of a LoCoMo-format file (the CJK development chats) in an
in-memory FTS5 table:

- `unicode61`: the tokenizer SpeakerMem used before (a CJK run is one token);
- `trigram`: FTS5's trigram tokenizer (every three characters; a query of one or two
  characters matches nothing);
- `segmented`: unicode61 over `index_text` (memory/search/cjk.py: a run's bigrams, then its
  characters), what both backends index now.

A second FTS5 table beside unicode61 holding only the CJK n-grams would find what
`segmented` finds, but FTS5's bm25() scores one table at a time: the two ranks would have to
be merged with their own document frequencies and lengths, which `segmented` never needs.

Measured: for words of 1 to 4 characters cut from the messages' CJK runs, the share of the
messages holding each word that a quoted query for it finds (`found_by_length`); the
evidence recall@10 of BM25 alone over each channel for the file's questions (queries built
as each way needs: `build_match` over segmented text; the question's runs as trigrams for
`trigram`; the question's words for `unicode61`); and the index's size in bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speakermem.memory.datasets.locomo import read_locomo
from speakermem.memory.search.cjk import index_text, phrase_form, runs
from speakermem.memory.search.fts_query import build_match, quote

WAYS = {
    "unicode61": "unicode61 remove_diacritics 2",
    "trigram": "trigram",
    "segmented": "unicode61 remove_diacritics 2",
}
WORD_LENGTHS = (1, 2, 3, 4)
WORDS_PER_LENGTH = 300
SEED = 7


def build(way: str, rows: list[tuple[int, str, str]]) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute(
        f"CREATE VIRTUAL TABLE f USING fts5(text, channel UNINDEXED, tokenize='{WAYS[way]}')"
    )
    conn.executemany(
        "INSERT INTO f (rowid, text, channel) VALUES (?, ?, ?)",
        [(i, index_text(t) if way == "segmented" else t, c) for i, c, t in rows],
    )
    conn.execute("INSERT INTO f (f) VALUES ('optimize')")
    return conn


def word_query(way: str, word: str) -> str:
    """A quoted word; on segmented text, as the index holds it (`phrase_form`)."""
    return quote(" ".join(phrase_form(word).split()) if way == "segmented" else word)


def question_match(way: str, question: str) -> str:
    if way == "segmented":
        return build_match(question)
    if way == "trigram":
        grams = {r[i : i + 3] for r in runs(question) for i in range(max(len(r) - 2, 0))}
        words = [w for w in build_match(question).split(" OR ") if w and not runs(w)]
        return " OR ".join([quote(g) for g in sorted(grams)] + words)
    return " OR ".join(quote(w) for w in question.split() if w.strip())


def measure(path: Path) -> dict[str, Any]:
    data = read_locomo(path)
    rows = [(i, m.scope.channel, m.text) for i, m in enumerate(data.messages)]
    ids = {i: m.message_id for i, m in enumerate(data.messages)}
    rng = random.Random(SEED)
    words: dict[int, list[str]] = {}
    for n in WORD_LENGTHS:
        pool = sorted(
            {r[i : i + n] for _, _, t in rows for r in runs(t) for i in range(len(r) - n + 1)}
        )
        words[n] = rng.sample(pool, min(WORDS_PER_LENGTH, len(pool)))
    out: dict[str, Any] = {
        "file": path.name,
        "messages": len(rows),
        "questions": len(data.questions),
        "ways": {},
    }
    for way in WAYS:
        conn = build(way, rows)
        found: dict[str, float] = {}
        for n, sample in words.items():
            hit = total = 0
            for w in sample:
                holders = {i for i, _, t in rows if w in t}
                match = word_query(way, w)
                got = {r[0] for r in conn.execute("SELECT rowid FROM f WHERE f MATCH ?", (match,))}
                hit += len(holders & got)
                total += len(holders)
            found[str(n)] = round(hit / total, 4) if total else 0.0
        recalls = []
        for q in data.questions:
            if not q.evidence:
                continue
            match = question_match(way, q.question)
            got: list[str] = []
            if match:
                got = [
                    ids[r[0]]
                    for r in conn.execute(
                        "SELECT rowid FROM f WHERE f MATCH ? AND channel = ?"
                        " ORDER BY bm25(f) LIMIT 10",
                        (match, q.scope.channel),
                    )
                ]
            recalls.append(len(set(got) & set(q.evidence)) / len(q.evidence))
        size = conn.execute("SELECT sum(length(block)) FROM f_data").fetchone()[0]
        out["ways"][way] = {
            "found_by_length": found,
            "bm25_recall_at_10": round(sum(recalls) / len(recalls), 4),
            "index_bytes": int(size),
        }
        conn.close()
    return out


def english_sizes(path: Path) -> dict[str, int]:
    """Index bytes of each way over English chats (segmentation leaves them unchanged)."""
    rows = [(i, m.scope.channel, m.text) for i, m in enumerate(read_locomo(path).messages)]
    out = {}
    for way in WAYS:
        conn = build(way, rows)
        out[way] = int(conn.execute("SELECT sum(length(block)) FROM f_data").fetchone()[0])
        conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path, help="a LoCoMo-format JSON file of CJK chats")
    ap.add_argument("--english", type=Path, help="a LoCoMo-format English file: index sizes")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    result = measure(args.file)
    if args.english:
        result["english_index_bytes"] = english_sizes(args.english)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

"""System 1 search on PostgreSQL against SQLite and brute force, on one small corpus.

The same messages go into a SQLite store and a PostgreSQL store; the searches whose
answer is a set or a count (which messages match, per-session term counts, per-speaker
matches, how a name is written) must agree exactly, rankings must follow BM25's rules
(a rare word outweighs a common one, the text column outweighs the speaker's name), and
dense search must equal exact cosine computed with numpy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tests.test_reliability_idempotency as idem
from speakermem.bot.dispatch import Dispatcher
from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import DeleteEvent, EditEvent, MessageEvent, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from speakermem.memory.search.fts_query import build_match, quote
from speakermem.memory.store.pg import bm25
from speakermem.memory.store.pg.bm25 import parse_match
from speakermem.memory.store.pg.message_vectors import vector_literal
from speakermem.memory.store.vectors import COARSE_WIDEN
from tests.conftest import T0, msg
from tests.fakes import HashEmbedder

SCOPE = Scope(platform="test", workspace="w1", channel="general")
OTHER = Scope(platform="test", workspace="w1", channel="random")

CORPUS = [
    ("Alice", "I planted tomatoes and basil in the garden this weekend"),
    ("Bob", "Gardening is relaxing, my tomatoes never grow though"),
    ("Carol", "The quarterly report is due on Friday"),
    ("Alice", "Can someone review the report before Friday?"),
    ("Dave", "I am running a marathon in October"),
    ("Bob", "Running every morning keeps me sane"),
    ("Carol", "Alice said the garden party moved to Sunday"),
    ("Dave", "The deploy to example.com failed at 3.5 seconds"),
    ("Erin", "well-known issue: the cache is stale again"),
    ("Alice", "the the the report report"),
    ("Bob", "Alice, the basil pesto was great"),
    ("Erin", "alice and bob went hiking"),
]


def events() -> list[MessageEvent]:
    out = [msg(SCOPE, f"m{i}", sp, text, i * 5) for i, (sp, text) in enumerate(CORPUS)]
    out.append(msg(OTHER, "o1", "Zed", "tomatoes in the other channel", 1))
    # a long gap starts a second session
    out.append(
        MessageEvent(
            scope=SCOPE,
            message_id="late",
            speaker_id="bob",
            speaker_name="Bob",
            text="more tomatoes next year",
            ts=T0 + timedelta(days=3),
        )
    )
    return out


async def open_engine(tmp_path: Path, url: str | None) -> MemoryEngine:
    cfg = MemoryConfig(store=StoreConfig(db_path=tmp_path / "s.db", db_url=url))
    return await MemoryEngine.open(cfg, HashEmbedder())


@pytest.fixture
async def pair(tmp_path: Path, pg_url: str) -> AsyncIterator[tuple[MemoryEngine, MemoryEngine]]:
    lite = await open_engine(tmp_path, None)
    pg = await open_engine(tmp_path, pg_url)
    try:
        for eng in (lite, pg):
            await eng.ingest_many(events())
            await eng.embed_pending()
        yield lite, pg
    finally:
        await lite.close()
        await pg.close()


async def pks_to_ids(eng: MemoryEngine, hits: list[tuple[int, float]]) -> list[str]:
    got = await eng.store.messages.get_many([pk for pk, _ in hits])
    return [got[pk].message_id for pk, _ in hits]


async def channel_pks(eng: MemoryEngine, *scopes: Scope) -> list[int]:
    out = []
    for s in scopes:
        pk = await eng.store.channels.lookup(s)
        assert pk is not None
        out.append(pk)
    return out


def test_parse_match_reads_the_expressions_the_callers_build() -> None:
    match = build_match("Alice's tomatoes, basil?", text_only={"alice"})
    assert parse_match(match) == [("alice", "A"), ("tomatoes", "AB"), ("basil", "AB")]
    assert parse_match(quote('say "hi" now')) == [('say "hi" now', "AB")]
    assert parse_match('{speaker_name} : "bob"') == [("bob", "B")]
    assert parse_match('{speaker_name} : "bob" OR "x"', columns="A") == [("x", "A")]


def test_vector_literal_round_trips_float32() -> None:
    v = np.random.default_rng(1).standard_normal(8).astype(np.float32)
    back = np.array(vector_literal(v)[1:-1].split(","), dtype=np.float32)
    assert np.array_equal(back, v)


QUERIES = [
    "tomatoes",
    "gardening tomatoes",
    "report friday",
    "running marathon",
    "example com",
    "well known cache",
    "alice",
    "basil pesto",
    "nothing matches xyzzy",
]


@pytest.mark.parametrize("question", QUERIES)
async def test_lexical_matches_and_scores_as_fts5_bm25(
    pair: tuple[MemoryEngine, MemoryEngine], question: str
) -> None:
    """Same matches, same BM25 (FTS5's IDF, k1, b, column weights and token lengths)."""
    lite, pg = pair
    match = build_match(question)
    results = []
    for eng in (lite, pg):
        pks = await channel_pks(eng, SCOPE)
        hits = await eng.store.messages.lexical(match, pks, 100)
        assert [s for _, s in hits] == sorted(s for _, s in hits)  # best (lowest) first
        results.append(dict(zip(await pks_to_ids(eng, hits), (s for _, s in hits), strict=True)))
    assert results[0].keys() == results[1].keys()
    for mid, score in results[0].items():
        assert results[1][mid] == pytest.approx(score, rel=1e-6), mid
    assert (not results[0]) == (question == "nothing matches xyzzy")


async def test_bm25_rare_word_and_text_column_outweigh(
    pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    _, pg = pair
    pks = await channel_pks(pg, SCOPE)
    # "marathon" occurs once, "running" twice: the message with both ranks first, the
    # one with only the rarer word before the one with only the commoner
    ids = await pks_to_ids(pg, await pg.store.messages.lexical('"running" OR "marathon"', pks, 10))
    assert ids == ["m4", "m5"]
    # "alice" in the text (weight 1.0) beats "alice" only as the speaker (weight 0.5)
    ids = await pks_to_ids(pg, await pg.store.messages.lexical('"alice"', pks, 20))
    by_speaker_only = {"m0", "m3", "m9"}
    in_text = {"m6", "m10", "m11"}
    assert set(ids) == by_speaker_only | in_text
    assert set(ids[:3]) == in_text
    # restricted to the text column, the speaker's own messages drop out
    ids = await pks_to_ids(pg, await pg.store.messages.lexical('{text} : "alice"', pks, 20))
    assert set(ids) == in_text


async def test_lexical_filters_channels_speakers_and_time(
    pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    lite, pg = pair
    for eng in (lite, pg):
        here = await channel_pks(eng, SCOPE)
        both = await channel_pks(eng, SCOPE, OTHER)
        repo = eng.store.messages
        assert "o1" not in await pks_to_ids(eng, await repo.lexical('"tomatoes"', here, 20))
        assert "o1" in await pks_to_ids(eng, await repo.lexical('"tomatoes"', both, 20))
        bob = await pks_to_ids(
            eng,
            await repo.lexical('"tomatoes"', here, 20, speakers=["bob"], speaker_names=["Bob"]),
        )
        assert set(bob) == {"m1", "late"}
        early = await pks_to_ids(
            eng,
            await repo.lexical(
                '"tomatoes"',
                here,
                20,
                since=T0.timestamp(),
                until=(T0 + timedelta(days=1)).timestamp(),
            ),
        )
        assert set(early) == {"m0", "m1"}


async def test_per_speaker_session_counts_and_name_case_agree_with_sqlite(
    pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    lite, pg = pair
    out = []
    for eng in (lite, pg):
        pks = await channel_pks(eng, SCOPE)
        repo = eng.store.messages
        by_speaker = await repo.lexical_by_speaker(
            '"tomatoes" OR "report"', pks, ["alice", "bob", "carol"], 5
        )
        ids = {}
        for speaker, got in by_speaker.items():
            ids[speaker] = set(await pks_to_ids(eng, [(pk, 0.0) for pk in got]))
        counts = await repo.session_term_counts([quote("tomatoes"), quote("report")], pks)
        sessions = {
            term: {session: n for (_, session), n in by_session.items()}
            for term, by_session in counts.items()
        }
        share = await repo.lowercase_share("alice", pks)
        # a term matching more than `cap` messages is left out, one matching none is empty
        capped = await repo.session_term_counts(
            [quote("tomatoes"), quote("xyzzy"), quote("alice")], pks, cap=3
        )
        assert quote("alice") not in capped and capped[quote("xyzzy")] == {}
        out.append((ids, sessions, share, {t: set(c.values()) for t, c in capped.items()}))
    assert out[0] == out[1]
    ids, sessions, (seen, lower), _ = out[1]
    assert ids["bob"] == {"m1", "late"} and ids["carol"] == {"m2"}
    assert sessions['"tomatoes"'] == {1: 2, 2: 1}
    assert seen == 3 and lower == pytest.approx(1 / 3)


async def test_dense_equals_exact_cosine(pair: tuple[MemoryEngine, MemoryEngine]) -> None:
    _, pg = pair
    pks = await channel_pks(pg, SCOPE)
    repo = pg.store.messages
    rows = await pg.store.db.read(
        "SELECT m.id, v.embedding FROM messages m JOIN message_vectors v ON v.id = m.id"
        " WHERE m.channel_pk = ?",
        (pks[0],),
    )
    ids = np.array([r[0] for r in rows])
    mat = np.stack([np.frombuffer(bytes(r[1]), dtype=np.float32) for r in rows])
    embedder = HashEmbedder()
    for question in ("tomatoes in the garden", "friday report", "hiking"):
        q = (await embedder.embed([question]))[0]
        sims = mat @ q
        order = np.argsort(-sims, kind="stable")[:5]
        # candidates covering the channel: the coarse pass keeps every row
        got = await repo.dense(q, pks, 5, len(ids))
        assert [pk for pk, _ in got] == [int(ids[i]) for i in order]
        assert [s for _, s in got] == pytest.approx([float(sims[i]) for i in order], abs=1e-6)


async def test_edits_and_deletes_leave_the_indexes(
    pair: tuple[MemoryEngine, MemoryEngine],
) -> None:
    _, pg = pair
    pks = await channel_pks(pg, SCOPE)
    repo = pg.store.messages
    await pg.edit(EditEvent(scope=SCOPE, message_id="m4", text="cycling tour", edited_at=T0))
    assert "m4" not in await pks_to_ids(pg, await repo.lexical('"marathon"', pks, 10))
    assert await pks_to_ids(pg, await repo.lexical('"cycling"', pks, 10)) == ["m4"]
    assert await pg.delete(DeleteEvent(scope=SCOPE, message_id="m2"))
    left = await pks_to_ids(pg, await repo.lexical('"quarterly"', pks, 10))
    assert left == []
    q = (await HashEmbedder().embed(["quarterly report"]))[0]
    dense_ids = await pks_to_ids(pg, await repo.dense(q, pks, 50, 50))
    assert "m2" not in dense_ids and "m4" not in dense_ids  # m4 waits for a new vector
    assert await pg.embed_pending() == 1
    counts = await repo.counts()
    assert counts["deleted"] == 1 and counts["unembedded"] == 0


async def pg_state(engine: MemoryEngine, embedder: HashEmbedder, scope: Scope) -> dict[str, Any]:
    """What a message leaves behind in its channel on PostgreSQL (the SQLite test's state(),
    with the index reads in this backend's terms)."""
    pk = await engine.store.channels.lookup(scope)
    assert pk is not None
    db = engine.store.db
    rows = await db.read(
        "SELECT id, message_id, text, speaker_id, speaker_name, deleted_at IS NOT NULL,"
        " edited_at, embedded, session_id, turn_index FROM messages WHERE channel_pk = ?",
        (pk,),
    )
    fts = {
        word: len(await engine.store.messages.lexical(quote(word), [pk], 10))
        for word in idem.WORDS.values()
    }
    ids = [r[0] for r in rows]
    vectors = await engine.store.messages.vectors(ids)
    bits = await db.read_in("SELECT rowid FROM messages_vec WHERE rowid IN ({marks})", ids)
    for r in rows:
        if r[0] in vectors:
            want = embedder.embed_sync([f"{r[4]}: {r[2]}"])[0]
            assert (vectors[r[0]] == want).all()
    records = await db.read(
        "SELECT count(*) FROM records r, json_array_elements_text(r.from_ids::json) j"
        " WHERE r.channel_pk = ? AND j = ?",
        (pk, idem.MID),
    )
    citing_deleted = await db.read(
        "SELECT count(*) FROM record_sources s JOIN messages m ON m.id = s.message_pk"
        " WHERE m.channel_pk = ? AND m.deleted_at IS NOT NULL",
        (pk,),
    )
    early = await db.read(
        "SELECT count(*) FROM early_changes WHERE platform = ? AND workspace = ? AND channel = ?",
        scope.key(),
    )
    return {
        "messages": [tuple(r[1:]) for r in rows],
        "fts": fts,
        "vectors": len(vectors),
        "vec_bits": len(bits),
        "records_citing": records[0][0],
        "record_sources_on_deleted": citing_deleted[0][0],
        "early": early[0][0],
    }


@pytest.mark.parametrize("with_delete", [True, False], ids=["create-edits-delete", "create-edits"])
async def test_any_order_with_duplicates_converges_on_postgres(
    tmp_path: Path, pg_url: str, with_delete: bool
) -> None:
    """tests/test_reliability_idempotency.py's convergence check over every order of a
    create, two edits (and a delete), with duplicates, on PostgreSQL."""
    embedder = HashEmbedder()
    engine = await MemoryEngine.open(
        MemoryConfig(store=StoreConfig(db_path=tmp_path / "x.db", db_url=pg_url)), embedder
    )
    try:
        dispatcher = Dispatcher(engine, RecallPipeline(engine))
        names = ["C", "E1", "E2", "D"] if with_delete else ["C", "E1", "E2"]
        base = Scope(platform="test", workspace="w1", channel="in-order")
        await idem.run_sequence(dispatcher, engine, base, names)
        expected = await pg_state(engine, embedder, base)
        words = idem.WORDS
        if with_delete:
            assert [m[1:5] for m in expected["messages"]] == [("", "", "", True)]
            assert expected["fts"] == dict.fromkeys(words.values(), 0)
            assert expected["vectors"] == expected["vec_bits"] == 0
            assert expected["records_citing"] == 0
        else:
            assert [m[1] for m in expected["messages"]] == [f"the {words['E2']} plan"]
            assert expected["fts"] == {words["C"]: 0, words["E1"]: 0, words["E2"]: 1}
            assert expected["vectors"] == expected["vec_bits"] == 1
            assert expected["records_citing"] == 1
        assert expected["early"] == 0
        # every order with one event doubled, and a sample with all doubled (fewer than
        # the SQLite test: each case costs more round trips here)
        cases = idem.sequences(names, sample_all_doubled=10, seed=9)
        for i, seq in enumerate(cases):
            scope = Scope(platform="test", workspace="w1", channel=f"case{i}")
            await idem.run_sequence(dispatcher, engine, scope, seq)
            assert await pg_state(engine, embedder, scope) == expected, f"order {seq}"
        assert not dispatcher.stats.errors
    finally:
        await engine.close()


async def test_two_processes_ingesting_one_channel_place_every_message_once(
    tmp_path: Path, pg_url: str
) -> None:
    """Two stores on one database (two processes) ingest interleaved batches into the same
    channels at once: sessions, turns and segments come out as from one writer."""
    engines = [await open_engine(tmp_path / str(i), pg_url) for i in range(2)]
    try:
        batches: list[list[MessageEvent]] = [[], []]
        for i in range(400):
            scope = SCOPE if i % 3 else OTHER
            batches[(i // 20) % 2].append(msg(scope, f"c{i}", "Al", f"word{i} text", i * 0.5))
        outcomes = await asyncio.gather(
            *(
                eng.ingest_many(batch[start : start + 20])
                for start in range(0, 200, 20)
                for eng, batch in zip(engines, batches, strict=True)
            )
        )
        assert sum(len(o) for o in outcomes) == 400
        db = engines[0].store.db
        rows = await db.read(
            "SELECT channel_pk, session_id, turn_index, segment_id FROM messages"
            " ORDER BY channel_pk, session_id, turn_index"
        )
        assert len(rows) == 400
        turns: dict[tuple[int, int], list[int]] = {}
        for channel_pk, session, turn, _ in rows:
            turns.setdefault((channel_pk, session), []).append(turn)
        for got in turns.values():
            assert got == list(range(len(got)))  # no turn placed twice or skipped
        segs = await db.read(
            "SELECT s.id, s.n_messages, count(m.id) FROM segments s"
            " LEFT JOIN messages m ON m.segment_id = s.id GROUP BY s.id, s.n_messages"
        )
        assert segs and all(n == c for _, n, c in segs)
        (opened,) = (await db.read("SELECT count(*) FROM segments WHERE state = 'open'"))[0]
        assert opened <= 2  # at most one open segment per channel
    finally:
        for eng in engines:
            await eng.close()


def hamming_then_cosine(
    ids: np.ndarray, mat: np.ndarray, q: np.ndarray, k: int, limit: int, *, widen: bool = False
) -> list[int]:
    """The reference two-pass search: the k rows nearest by Hamming distance between sign
    bits (ties by row id), then the best `limit` of them by exact cosine. With `widen`: the
    k best of COARSE_WIDEN * k nearest by the query's dot product with their signs."""
    ham = ((mat > 0) != (q > 0)).sum(axis=1)
    order = sorted(range(len(ids)), key=lambda i: (int(ham[i]), int(ids[i])))
    if widen:
        wide = order[: COARSE_WIDEN * k]
        score = np.where(mat[wide] > 0, 1.0, -1.0) @ q
        cand = [wide[i] for i in np.argsort(-score, kind="stable")[:k]]
    else:
        cand = order[:k]
    sims = mat[cand] @ q
    return [int(ids[cand[i]]) for i in np.argsort(-sims, kind="stable")[:limit]]


@pytest.mark.parametrize("narrow", [False, True], ids=["rescore-all", "narrowed-by-pgvector"])
async def test_dense_coarse_pass_ranks_sign_bits_by_hamming(
    pair: tuple[MemoryEngine, MemoryEngine], narrow: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer candidates than rows: the stored sign bits choose them (as SQLite's binary
    index does), `oversample_fraction` of the channel's rows when that is more (then the
    best of COARSE_WIDEN times as many by the query's score). Narrowed: pgvector's inner
    product keeps only the best 2 * limit of them before numpy."""
    import speakermem.memory.store.pg.message_vectors as pgv

    if narrow:
        monkeypatch.setattr(pgv, "RESCORE_ALL", 0)
        monkeypatch.setattr(pgv, "RESCORE_MARGIN", 0)
    _, pg = pair
    pks = await channel_pks(pg, SCOPE)
    rows = await pg.store.db.read(
        "SELECT m.id, v.embedding FROM messages m JOIN message_vectors v ON v.id = m.id"
        " WHERE m.channel_pk = ? ORDER BY m.id",
        (pks[0],),
    )
    ids = np.array([r[0] for r in rows])
    mat = np.stack([np.frombuffer(bytes(r[1]), dtype=np.float32) for r in rows])
    rng = np.random.default_rng(4)
    differs = 0
    for n in range(30):
        q = np.asarray(rng.standard_normal(mat.shape[1]), dtype=np.float32)
        q /= np.linalg.norm(q)
        exact = [int(ids[i]) for i in np.argsort(-(mat @ q), kind="stable")[:1]]
        for oversample, fraction in ((1, 0.0), (1, 0.15), (4, 0.0)):
            k = max(1, oversample, int(np.ceil(fraction * len(ids))))
            want = hamming_then_cosine(ids, mat, q, k, 1, widen=k > max(1, oversample))
            got = await pg.store.messages.dense(q, pks, 1, oversample, fraction)
            assert [pk for pk, _ in got] == want, (n, oversample, fraction)
            differs += want != exact
    assert differs > 0  # the coarse pass does narrow the search on this corpus


def zipf_corpus(n: int) -> list[MessageEvent]:
    rng = np.random.default_rng(3)
    p = 1 / np.arange(1, 201) ** 1.1
    words = rng.choice(200, size=(n, 8), p=p / p.sum())
    return [
        msg(SCOPE, f"z{i}", f"s{i % 7}", " ".join(f"w{w}" for w in words[i, : 3 + i % 6]), i)
        for i in range(n)
    ]


async def test_lexical_pruning_returns_the_full_ranking(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scoring the rarest terms' rows first, then stopping when the other terms cannot
    reach the ranking, returns exactly what scoring every matching row returns."""
    import speakermem.memory.store.pg.messages as pgm

    monkeypatch.setattr(pgm, "STATS_EXACT_BELOW", 0)  # take the large-corpus path
    monkeypatch.setattr(pgm, "PRUNE_BUDGET", 40)
    eng = await open_engine(tmp_path, pg_url)
    try:
        await eng.ingest_many(zipf_corpus(600))
        repo = eng.store.messages
        assert isinstance(repo, pgm.PgMessageRepo)
        pks = await channel_pks(eng, SCOPE)
        calls: list[object] = []
        ranked = repo._ranked

        async def spy(*args: Any, **kwargs: Any) -> list[tuple[int, float]]:
            calls.append(args[5])  # the essential items (None: every matching row)
            return await ranked(*args, **kwargs)

        monkeypatch.setattr(repo, "_ranked", spy)
        pruned_answers = 0
        rng = np.random.default_rng(9)
        for _ in range(24):
            words = [f"w{w}" for w in rng.choice(200, 4, replace=False, p=None)]
            words[0] = f"w{rng.integers(0, 3)}"  # always one very common word
            match = build_match(" ".join(words))
            for limit in (5, 20):
                calls.clear()
                got = await repo.lexical(match, pks, limit)
                pruned_answers += len(calls) == 1 and calls[0] is not None
                stats = await repo._cached_stats()
                full = await ranked(match, pks, limit, parse_match(match), None, None, stats)
                assert [pk for pk, _ in got] == [pk for pk, _ in full], match
                assert [s for _, s in got] == pytest.approx([s for _, s in full], rel=1e-9)
        assert pruned_answers > 0  # the pruned statement alone answered some queries
        # with the common terms' rows capped hard, a query whose rare terms decide the
        # ranking (MaxScore: the limit-th rare-row score above the common terms' bound)
        # still gets exactly the full ranking: the capped rows score below it
        monkeypatch.setattr(pgm, "COMMON_FILL", 2)
        decided = 0
        for _ in range(24):
            words = [f"w{w}" for w in rng.choice(200, 4, replace=False, p=None)]
            words[0] = f"w{rng.integers(0, 3)}"
            match = build_match(" ".join(words))
            items = parse_match(match)
            for limit in (5, 20):
                calls.clear()
                got = await repo.lexical(match, pks, limit)
                stats = await repo._cached_stats()
                assert stats is not None
                dfs = await repo._doc_freqs(items)
                (essential,) = calls
                if not essential:
                    continue
                ess = [int(i) for i in essential]  # type: ignore[attr-defined]
                rare = await ranked(match, pks, limit, items, dfs, ess, stats)
                bound = 0.0
                for i, df in enumerate(dfs):
                    if df is not None and i + 1 not in ess:
                        bound += bm25.idf(stats[0], df) * (bm25.K1 + 1)
                if len(rare) < limit or -rare[limit - 1][1] <= bound:
                    continue
                decided += 1
                full = await ranked(match, pks, limit, items, None, None, stats)
                assert [pk for pk, _ in got] == [pk for pk, _ in full], match
        assert decided > 0
        # capped: only COMMON_FILL rows of the common terms are scored, each exactly
        monkeypatch.setattr(pgm, "COMMON_FILL", 5)
        match = build_match("w0 w1 w2")
        stats = await repo._cached_stats()
        every = dict(await ranked(match, pks, 1000, parse_match(match), None, None, stats))
        got = await repo.lexical(match, pks, 20)
        assert len(got) == 5 < len(every)
        assert [s for _, s in got] == sorted(s for _, s in got)
        for pk, score in got:
            assert score == pytest.approx(every[pk], rel=1e-9)
    finally:
        await eng.close()


async def test_concurrent_searches_count_a_shared_term_once(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rankings of one question run concurrently and share terms: a document frequency
    being counted is awaited by the others, so each item is counted once, and every
    caller gets the count a lone lookup gets (a repeated item too)."""
    import speakermem.memory.store.pg.messages as pgm

    monkeypatch.setattr(pgm, "STATS_EXACT_BELOW", 0)  # the large-corpus path counts dfs
    eng = await open_engine(tmp_path, pg_url)
    try:
        await eng.ingest_many(zipf_corpus(300))
        repo = eng.store.messages
        assert isinstance(repo, pgm.PgMessageRepo)
        counted: list[list[tuple[str, str]]] = []
        count = repo._count_doc_freqs
        release = asyncio.Event()

        async def slow_count(items: list[tuple[str, str]]) -> list[int | None]:
            counted.append(list(items))
            await release.wait()  # every caller has asked before the first count returns
            return await count(items)

        monkeypatch.setattr(repo, "_count_doc_freqs", slow_count)
        shared = [("w0", "AB"), ("w5", "A")]
        asks = [
            [*shared, ("w1", "AB")],
            [("w5", "A"), ("w2", "AB"), ("w5", "A")],
            [*shared, ("nosuchword", "AB")],
        ]
        tasks = [asyncio.ensure_future(repo._doc_freqs(items)) for items in asks]
        for _ in range(5):
            await asyncio.sleep(0)
        release.set()
        got = await asyncio.gather(*tasks)
        flat = [item for items in counted for item in items]
        assert sorted(flat) == sorted(set(flat))  # no item counted twice
        assert set(flat) == {item for items in asks for item in items}
        monkeypatch.setattr(repo, "_count_doc_freqs", count)
        for items, dfs in zip(asks, got, strict=True):
            repo._df.clear()
            assert dfs == await repo._doc_freqs(items)
        assert got[1][0] == got[1][2] is not None
    finally:
        await eng.close()

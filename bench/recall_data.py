"""The /recall benchmark's data: one channel of seeded synthetic multi-party chat (sessions
with a few topics each, Zipf vocabulary, Zipf-weighted speakers, occasional @-mentions) and
the System 2 records derived from it, built once into a benchmark database."""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from benchlib.build import Target, derived_record, ingest_timed, settle, store_random_vectors
from benchlib.vectors import load_minilm, unit_vectors
from benchlib.words import FUNCTION, TOPICS, VERBS, chat_words

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import GROUP, Layer, MessageEvent, NewRecord, Scope

SCOPE = Scope(platform="slack", workspace="TBENCH", channel="CBENCH")
BUILD_VERSION = 2
"""Bump when the generated data changes, so stale databases are rebuilt."""

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


class ChatGen:
    """One channel's multi-party chat: sessions with a few topics each, Zipf vocabulary,
    Zipf-weighted speakers, occasional @-mentions of other members."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.tail = chat_words(np.random.default_rng(seed + 1), 4_000)
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
        if source == GROUP:  # a group's record rests on two speakers (the attribution rule)
            other = self.by_speaker[PEOPLE[1][0]]
            picks.append(other[int(rng.integers(len(other)))])
        names = dict(PEOPLE)
        who = "The team" if owner == GROUP else names[owner].split()[0]
        extra = " ".join(self.tail_word() for _ in range(int(rng.integers(3, 12))))
        content = (
            f"{who} {VERBS[int(rng.integers(len(VERBS)))]} the {self.topic()} {self.topic()}"
            f" {extra}"
        )
        if source not in (owner, GROUP):
            content = f"{names[source].split()[0]} says: {content}"
        return derived_record(
            layer, content, owner=owner, source=source, event=self.topic(), cites=picks
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


async def build(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """Ingest the chat, store vectors, add the records; write a marker when complete."""
    await asyncio.to_thread(target.create)
    embedder = load_minilm(warm=True) if args.real_embeddings else None
    if args.real_embeddings and embedder is None:
        raise SystemExit("--real-embeddings needs the MiniLM embedder")
    t_build = time.perf_counter()
    engine = await MemoryEngine.open(target.config(), embedder)
    gen = ChatGen(args.seed)
    vec_rng = np.random.default_rng(args.seed + 2)
    stats: dict[str, Any] = {"vectors": "MiniLM" if embedder else "synthetic random unit"}
    try:
        t0 = time.perf_counter()
        await ingest_timed(engine, gen.events, args.messages, progress="ingest")
        stats["ingest_s"] = round(time.perf_counter() - t0, 1)

        t0 = time.perf_counter()
        if embedder is not None:
            await engine.embed_pending(batch_size=256)
        else:
            await store_random_vectors(engine, vec_rng, batch=2_000)
        stats["vectors_s"] = round(time.perf_counter() - t0, 1)
        print(f"    message vectors stored ({stats['vectors']})", flush=True)

        t0 = time.perf_counter()
        ids = await add_records(args, engine, gen, embedder, vec_rng)
        stats["records_s"] = round(time.perf_counter() - t0, 1)
        stats["records"] = len(ids)
        t0 = time.perf_counter()
        stats["settled_tables"] = await settle(engine)
        stats["settle_s"] = round(time.perf_counter() - t0, 1)
        stats["db_bytes"] = await engine.store.db_size_bytes()
        stats["build_s"] = round(time.perf_counter() - t_build, 1)
    finally:
        await engine.close()
    stats = {"args": build_key(args), "backend": args.backend, **stats}
    await asyncio.to_thread(target.mark_built, stats)
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

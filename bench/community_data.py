"""The community-scale benchmarks' workspace: 1,000 channels and 50,000 members, one big
channel of 5,000 active speakers and 100,000 messages, derived records; the names, text and
questions are seeded, and the database is built once and reused."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from benchlib.build import Target, derived_record, store_random_vectors
from benchlib.vectors import unit_vectors
from benchlib.words import FUNCTION, TOPICS, VERBS, chat_words

from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import GROUP, Layer, MessageEvent, NewRecord, Scope

PLATFORM, WORKSPACE = "slack", "TCOMMUNITY"
BIG = Scope(platform=PLATFORM, workspace=WORKSPACE, channel="C0000")
BUILD_VERSION = 1

ONE = [
    "What did {a} say about the {t1} {t2}?",
    "Which {t1} does {a} prefer now?",
    "Has {a} mentioned the {t1} recently?",
    "What does {a} think about the {t1}?",
]
TWO = [
    "What does {a} think of {b}'s {t1} plan?",
    "What did {a} tell {b} about the {t1}?",
    "Who owns the {t1} {t2}, {a} or {b}?",
]
NOBODY = [
    "Why don't we use the {t1}?",
    "What is the new {t1} version?",
    "What does everyone think about the {t1} {t2}?",
    "What did the team decide about the {t1}?",
    "When is the {t1} {t2} happening?",
]
KINDS = {"one person": ONE, "two people": TWO, "nobody": NOBODY}


class Community:
    """Names, speakers and text for the synthetic workspace (deterministic per seed)."""

    def __init__(self, seed: int, members: int, speakers: int) -> None:
        self.rng = np.random.default_rng(seed)
        words = chat_words(np.random.default_rng(seed + 1), 27_000)
        firsts = [w.capitalize() for w in words[:3_000]]
        lasts = [w.capitalize() for w in words[3_000:23_000]]
        self.tail = words[23_000:]
        self.ids = [f"U{i:06d}" for i in range(members)]
        self.names = [
            f"{firsts[int(f)]} {lasts[int(s)]}"
            for f, s in zip(
                self.rng.integers(len(firsts), size=members),
                self.rng.integers(len(lasts), size=members),
                strict=True,
            )
        ]
        self.speakers = speakers
        w = 1.0 / np.arange(1, speakers + 1) ** 0.9
        self.speaker_cdf = np.cumsum(w / w.sum())
        t = 1.0 / np.arange(1, len(TOPICS) + 1) ** 0.6
        self.topic_cdf = np.cumsum(t / t.sum())
        r = 1.0 / (np.arange(1, len(self.tail) + 1) + 2.7) ** 1.07
        self.tail_cdf = np.cumsum(r / r.sum())
        self.by_speaker: dict[int, list[tuple[str, float]]] = {}

    def pick(self, cdf: np.ndarray, n: int) -> np.ndarray:
        return np.searchsorted(cdf, self.rng.random(n), side="right").clip(0, len(cdf) - 1)

    def topic(self) -> str:
        return TOPICS[int(self.pick(self.topic_cdf, 1)[0])]

    def text(self, n_words: int, topics: list[str]) -> str:
        rng = self.rng
        kinds = rng.random(n_words)
        tails = iter(self.tail[j] for j in self.pick(self.tail_cdf, n_words))
        words = []
        for k in kinds:
            if k < 0.45:
                words.append(FUNCTION[int(rng.integers(len(FUNCTION)))])
            elif k < 0.53:
                words.append(topics[int(rng.integers(len(topics)))])
            else:
                words.append(next(tails))
        return " ".join(words)

    def big_channel(self, n: int, start: int, clock: float) -> tuple[list[MessageEvent], float]:
        rng = self.rng
        out: list[MessageEvent] = []
        lengths = np.clip(np.rint(rng.lognormal(2.3, 0.6, size=n)), 3, 40).astype(int)
        gaps = rng.exponential(20.0, size=n)
        gaps[rng.random(n) < 0.01] += 3 * 3600.0
        who = self.pick(self.speaker_cdf, n)
        topics = [self.topic() for _ in range(3)]
        for i in range(n):
            if gaps[i] > 1800:
                topics = [self.topic() for _ in range(3)]
            clock += float(gaps[i])
            text = self.text(int(lengths[i]), topics)
            if rng.random() < 0.05:  # a mention of another active speaker
                other = self.names[int(self.pick(self.speaker_cdf, 1)[0])]
                text = f"{other.split()[0] if rng.random() < 0.5 else other} {text}"
            sid = int(who[i])
            mid = f"{1_700_000_000 + start + i}.{(start + i) % 1_000_000:06d}"
            self.by_speaker.setdefault(sid, []).append((mid, clock))
            out.append(
                MessageEvent(
                    scope=BIG,
                    message_id=mid,
                    speaker_id=self.ids[sid],
                    speaker_name=self.names[sid],
                    text=text[0].upper() + text[1:],
                    ts=datetime.fromtimestamp(clock, UTC),
                )
            )
        return out, clock

    def record(self, supersedes: int | None, owner_sid: int | None) -> tuple[NewRecord, int | None]:
        rng = self.rng
        group = owner_sid is None and rng.random() < 0.1
        sid = owner_sid if owner_sid is not None else int(self.pick(self.speaker_cdf, 1)[0])
        source_sid = sid if group or rng.random() < 0.85 else int(self.pick(self.speaker_cdf, 1)[0])
        pool = self.by_speaker.get(source_sid) or self.by_speaker[0]
        picks = [pool[int(rng.integers(len(pool)))] for _ in range(int(rng.integers(1, 4)))]
        if group:  # a group's record rests on two speakers (the attribution rule)
            for _ in range(20):
                other_sid = int(self.pick(self.speaker_cdf, 1)[0])
                other = self.by_speaker.get(other_sid)
                if other_sid != source_sid and other:
                    picks.append(other[int(rng.integers(len(other)))])
                    break
        who = "The team" if group else self.names[sid].split()[0]
        extra = " ".join(
            self.tail[int(j)] for j in self.pick(self.tail_cdf, int(rng.integers(3, 12)))
        )
        verb = VERBS[int(rng.integers(len(VERBS)))]
        content = f"{who} {verb} the {self.topic()} {self.topic()} {extra}"
        layer = Layer.INSIGHT if group else (Layer.CORE if rng.random() < 0.6 else Layer.PROFILE)
        owner = GROUP if group else self.ids[sid]
        source = GROUP if group else self.ids[source_sid]
        if source not in (owner, GROUP):
            content = f"{self.names[source_sid].split()[0]} says: {content}"
        rec = derived_record(
            layer,
            content,
            owner=owner,
            source=source,
            event=self.topic(),
            cites=picks,
            supersedes=supersedes,
        )
        return rec, None if group else sid

    def question(self, kind: str, i: int) -> str:
        rng = self.rng
        templates = KINDS[kind]
        # people who talk get asked about: the top 1,000 speakers, sometimes anyone active
        pool = min(1_000, self.speakers) if rng.random() < 0.8 else self.speakers
        a, b = (int(x) for x in rng.choice(pool, size=2, replace=False))

        def name(sid: int) -> str:
            full = self.names[sid]
            return full if rng.random() < 0.7 else full.split()[0]

        return templates[i % len(templates)].format(
            a=name(a), b=name(b), t1=self.topic(), t2=self.topic()
        )


def db_file(args: argparse.Namespace) -> Path:
    name = (
        f"community-v{BUILD_VERSION}-{args.channels}c-{args.members}u-{args.speakers}s-"
        f"{args.messages}m-{args.records}r-s{args.seed}.db"
    )
    return Path(args.db_dir).expanduser() / name


async def build(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """Build the workspace into `target` (a SQLite file), marked complete when done."""
    target.create()
    engine = await MemoryEngine.open(target.config(), None)
    com = Community(args.seed, args.members, args.speakers)
    vec_rng = np.random.default_rng(args.seed + 2)
    stats: dict[str, Any] = {}
    t_all = time.perf_counter()
    try:
        t0 = time.perf_counter()
        clock = datetime(2024, 1, 1, 9, tzinfo=UTC).timestamp()
        done = 0
        while done < args.messages:
            n = min(20_000, args.messages - done)
            events, clock = com.big_channel(n, done, clock)
            await engine.ingest_many(events)
            done += n
            print(f"    big channel: {done:,}/{args.messages:,} messages", flush=True)
        stats["ingest_big_s"] = round(time.perf_counter() - t0, 1)

        # small channels: ~members*2/channels members each, 20 messages each
        t0 = time.perf_counter()
        channels = [
            Scope(platform=PLATFORM, workspace=WORKSPACE, channel=f"C{i:04d}")
            for i in range(1, args.channels)
        ]
        rng = com.rng
        homes = rng.integers(len(channels), size=(args.members, 2))
        repo = engine.store.channels
        async with engine.store.db.transaction() as tx:
            pks = [await repo.ensure(tx, s) for s in [BIG, *channels]]
            await repo.upsert_users(
                tx, BIG, [(uid, name, False) for uid, name in zip(com.ids, com.names, strict=True)]
            )
            now = time.time()
            rows: list[tuple[object, ...]] = [
                (pks[0], PLATFORM, WORKSPACE, BIG.channel, com.ids[u], now)
                for u in range(args.speakers, min(args.members, args.speakers + args.lurkers))
            ]
            for u in range(args.members):
                for c in set(int(x) for x in homes[u]):
                    rows.append(
                        (pks[c + 1], PLATFORM, WORKSPACE, channels[c].channel, com.ids[u], now)
                    )
            await repo.add_member_rows(tx, rows)
        stats["roster_rows"] = len(rows)
        small: list[MessageEvent] = []
        for c, scope in enumerate(channels):
            members = np.flatnonzero((homes == c).any(axis=1))[:50]
            for j in range(20):
                sid = int(members[j % len(members)]) if len(members) else 0
                small.append(
                    MessageEvent(
                        scope=scope,
                        message_id=f"s{c}.{j}",
                        speaker_id=com.ids[sid],
                        speaker_name=com.names[sid],
                        text=com.text(12, [com.topic()]),
                        ts=datetime.fromtimestamp(clock + j * 60.0, UTC),
                    )
                )
        for s in range(0, len(small), 20_000):
            await engine.ingest_many(small[s : s + 20_000])
        stats["small_channels_s"] = round(time.perf_counter() - t0, 1)

        t0 = time.perf_counter()
        await store_random_vectors(engine, vec_rng, batch=5_000)
        stats["vectors_s"] = round(time.perf_counter() - t0, 1)
        print("    message vectors stored", flush=True)

        t0 = time.perf_counter()
        heads: list[tuple[int, int | None]] = []  # (record id, owner speaker) of active heads
        made = 0
        while made < args.records:
            batch: list[NewRecord] = []
            owners: list[int | None] = []
            replaced: set[int] = set()
            for _ in range(min(2_000, args.records - made)):
                if heads and com.rng.random() < 0.1:
                    k = int(com.rng.integers(len(heads)))
                    rid, sid = heads[k]
                    if rid in replaced or sid is None:
                        rec, sid = com.record(None, None)
                    else:
                        replaced.add(rid)
                        rec, sid = com.record(rid, sid)
                else:
                    rec, sid = com.record(None, None)
                batch.append(rec)
                owners.append(sid)
            ids = await engine.store.records.add_records(
                BIG, batch, unit_vectors(vec_rng, len(batch))
            )
            heads = [h for h in heads if h[0] not in replaced]
            heads += list(zip(ids, owners, strict=True))
            made += len(batch)
        stats["records_s"] = round(time.perf_counter() - t0, 1)
        print(f"    {made:,} records", flush=True)
    finally:
        await engine.close()
    stats["build_s"] = round(time.perf_counter() - t_all, 1)
    target.mark_built(stats)
    return stats


async def ready_store(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The database for these options (built once, reused while complete; --rebuild to
    start over) and its build statistics."""
    target = Target(db_file(args))
    stats = None if args.rebuild else target.built()
    if stats is None:
        print(f"Building {target.path} ...", flush=True)
        stats = await build(args, target)
    else:
        print(f"Reusing {target.path} (--rebuild to start over)", flush=True)
    return target.path, stats

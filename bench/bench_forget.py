"""How long the forgetting cascade takes: forget a person, one message, and a retention run.

    python bench/bench_forget.py --messages 50000 --people 20 --channels 10

Builds a store with messages (random unit vectors) and one derived record per 10 messages
(each citing two messages of different people), then times the cascade.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from speakermem.memory.config import MemoryConfig, StoreConfig
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import Layer, MessageEvent, NewRecord, RecordScope, Scope

T0 = datetime(2024, 1, 1, tzinfo=UTC)


async def build(engine: MemoryEngine, n: int, people: int, channels: int) -> None:
    rng = np.random.default_rng(7)
    scopes = [Scope(platform="b", workspace="w", channel=f"c{i}") for i in range(channels)]
    events = [
        MessageEvent(
            scope=scopes[i % channels],
            message_id=f"m{i}",
            speaker_id=f"u{i % people}",
            speaker_name=f"User {i % people}",
            text=f"message {i} about topic {i % 97} and thing {i % 13}",
            ts=T0 + timedelta(minutes=i),
        )
        for i in range(n)
    ]
    await engine.ingest_many(events, batch_size=5_000)
    while items := await engine.store.messages.pending_embeddings(5_000):
        vecs = rng.standard_normal((len(items), 384)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        await engine.store.messages.store_vectors(items, vecs)
    for c, scope in enumerate(scopes):
        ids = [i for i in range(c, n, channels)]
        records: list[NewRecord] = []
        for j in range(0, len(ids) - 1, 10):
            a, b = ids[j], ids[j + 1]
            records.append(
                NewRecord(
                    layer=Layer.PROFILE,
                    record_scope=RecordScope.PERSON,
                    content=f"user {a % people} said thing {a % 13}",
                    source=f"u{a % people}",
                    owner=f"u{b % people}",
                    event="",
                    time=T0,
                    session_id=None,
                    from_ids=(f"m{a}", f"m{b}"),
                    writer_model="bench",
                    prompt_version="b",
                )
            )
        vecs = rng.standard_normal((len(records), 384)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        await engine.store.records.add_records(scope, records, vecs)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = MemoryConfig(store=StoreConfig(db_path=Path(tmp) / "f.db"))
        engine = await MemoryEngine.open(cfg)
        try:
            t = time.perf_counter()
            await build(engine, args.messages, args.people, args.channels)
            built = time.perf_counter() - t
            gov = Governance(engine)
            out: dict[str, object] = {"messages": args.messages, "build_s": round(built, 1)}
            t = time.perf_counter()
            r = await gov.forget_message(
                Scope(platform="b", workspace="w", channel="c0"), "m0", actor="bench"
            )
            out["forget_message_ms"] = round((time.perf_counter() - t) * 1000, 1)
            t = time.perf_counter()
            r = await gov.forget_user("b", "w", "u1", actor="bench")
            out["forget_user_s"] = round(time.perf_counter() - t, 2)
            out["forget_user_receipt"] = r.counts
            await gov.set_retention("b", "w", None, 1, actor="bench")
            cutoff = T0 + timedelta(minutes=args.messages // 10, days=1)
            t = time.perf_counter()
            r = await gov.apply_retention(now=cutoff.timestamp(), actor="bench")
            out["retention_s"] = round(time.perf_counter() - t, 2)
            out["retention_receipt"] = r.counts
            print(json.dumps(out, indent=2))
        finally:
            await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--people", type=int, default=20)
    parser.add_argument("--channels", type=int, default=10)
    asyncio.run(main(parser.parse_args()))

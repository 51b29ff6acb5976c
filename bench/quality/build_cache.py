"""Cache per-question raw System 1 rankings of an eval database for offline fusion studies.

Runs the production `recall_rankings` (deep pool) plus a few variants (FTS5 speaker-name
column weights, dense on the issue) and the per-term session counts, and pickles them with
per-message metadata and vectors, so `ablation.py` can evaluate fusion/re-ranking rules in
pure Python in seconds.

    python bench/quality/build_cache.py locomo /work/evalq/locomo.db \
        ../shared/data/locomo/locomo-dev.json /work/evalq/locomo.pkl
"""

from __future__ import annotations

import argparse
import asyncio
import pickle
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speakermem.bot.settings import load_settings
from speakermem.integrations.app import open_engine
from speakermem.memory.datasets.friendsqa import read_friendsqa
from speakermem.memory.datasets.locomo import read_locomo
from speakermem.memory.query.projection import fallback_projection
from speakermem.memory.query.system1 import phrase_match, recall_rankings
from speakermem.memory.query.timewords import resolve_time
from speakermem.memory.search.fts_query import build_match, query_terms, quote

SPEAKER_WEIGHTS = (0.5, 1.0, 2.0)


async def lexical(
    eng: Any,
    match: str,
    cpk: int,
    limit: int,
    w: float,
    *,
    speakers: list[str] | None = None,
    since: float | None = None,
    until: float | None = None,
) -> list[int]:
    if not match:
        return []
    full = f'{{text speaker_name}} : ({match}) AND channel_tag : ("c{cpk}")'
    sql = (
        f"SELECT m.id, bm25(messages_fts, 1.0, {w}, 0.0) AS score FROM messages_fts"
        " JOIN messages m ON m.id = messages_fts.rowid WHERE messages_fts MATCH ?"
        " AND m.deleted_at IS NULL"
    )
    params: list[object] = [full]
    if speakers:
        sql += f" AND m.speaker_id IN ({','.join('?' * len(speakers))})"
        params.extend(speakers)
    if since is not None:
        sql += " AND m.ts >= ? AND m.ts < ?"
        params.extend([since, until])
    sql += " ORDER BY score LIMIT ?"
    params.append(limit)
    return [r[0] for r in await eng.store.db.read(sql, params)]


async def collect(args: argparse.Namespace) -> dict[str, Any]:
    reader = read_locomo if args.dataset == "locomo" else read_friendsqa
    ds = reader(Path(args.data))
    settings = load_settings(db_path=args.db)
    items: list[dict[str, Any]] = []
    async with open_engine(settings) as eng:
        meta: dict[int, tuple[Any, ...]] = {}
        nsess: dict[int, int] = {}
        for scope in ds.scopes:
            (pk,) = await eng.channel_pks([scope])
            nsess[pk] = await eng.store.messages.session_total([pk])
            rows = await eng.store.db.read(
                "SELECT id, message_id, session_id, turn_index, speaker_id, speaker_name, text"
                " FROM messages WHERE channel_pk=? AND deleted_at IS NULL",
                (pk,),
            )
            for r in rows:
                meta[r[0]] = (r[1], r[2], r[3], r[4], pk, r[5], r[6])
        vectors = await eng.store.messages.vectors(list(meta))
        rosters = {sc: await eng.members(sc) for sc in ds.scopes}
        started = time.time()
        for q in ds.questions:
            if not q.evidence:
                continue
            pks = await eng.channel_pks([q.scope])
            cpk = pks[0]
            proj = fallback_projection(q.question, rosters[q.scope])
            latest = await eng.store.messages.latest_ts(pks)
            win = resolve_time(q.question, datetime.fromtimestamp(latest, UTC))
            rk = await recall_rankings(eng, q.question, proj, pks, pool=args.depth, window=win)
            lists = dict(rk.lists)
            issue_m, question_m, phrase_m = (
                build_match(proj.issue),
                build_match(q.question),
                phrase_match(q.question),
            )
            people = [p for p in proj.speakers if p not in ("GROUP", "ALL")]
            for w in SPEAKER_WEIGHTS:
                tag = f"@{w:g}"
                lists["issue" + tag] = await lexical(eng, issue_m, cpk, args.depth, w)
                lists["question" + tag] = await lexical(eng, question_m, cpk, args.depth, w)
                lists["phrase" + tag] = await lexical(eng, phrase_m, cpk, args.depth, w)
                if people and issue_m:
                    lists["speaker" + tag] = await lexical(
                        eng, issue_m, cpk, args.depth, w, speakers=people
                    )
                if win is not None:
                    lists["time" + tag] = await lexical(
                        eng,
                        issue_m or question_m,
                        cpk,
                        args.depth,
                        w,
                        since=win.start.timestamp(),
                        until=win.end.timestamp(),
                    )
            ivec = await eng.embed_query(proj.issue) if proj.issue.strip() else None
            qvec = await eng.embed_query(q.question)
            if ivec is not None:
                d = await eng.store.messages.dense(
                    ivec, pks, args.depth, eng.config.store.dense_oversample
                )
                lists["dense_issue"] = [pk for pk, _ in d]
            terms = list(dict.fromkeys(query_terms(q.question) + query_terms(proj.issue)))
            counts = await eng.store.messages.session_term_counts([quote(t) for t in terms], pks)
            items.append(
                dict(
                    id=q.id,
                    q=q.question,
                    ev=q.evidence,
                    any_of=q.any_of,
                    cat=q.category,
                    issue=proj.issue,
                    speakers=people,
                    cpk=cpk,
                    lists=lists,
                    win=win is not None,
                    qvec=qvec,
                    ivec=ivec,
                    sess_terms={t: counts.get(quote(t), {}) for t in terms},
                    q_terms=query_terms(q.question)[:12],
                    nsess=nsess[cpk],
                )
            )
        print(f"{len(items)} questions in {time.time() - started:.1f}s")
    return {"items": items, "meta": meta, "vectors": vectors}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dataset", choices=["locomo", "friendsqa"])
    p.add_argument("db", help="a COPY of the eval database (read only here)")
    p.add_argument("data", help="dataset json")
    p.add_argument("out", help="pickle to write")
    p.add_argument("--depth", type=int, default=100, help="candidates per list")
    args = p.parse_args()
    data = asyncio.run(collect(args))
    with open(args.out, "wb") as fh:
        pickle.dump(data, fh)

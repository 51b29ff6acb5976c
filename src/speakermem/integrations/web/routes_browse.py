"""Browsing what the bot remembers: the overview, a channel (switch, retention, catch-up,
message search, records by person, who talks to whom) and a record with its sources."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from aiohttp import web

from speakermem.integrations.web.graph import layout
from speakermem.integrations.web.guard import Viewer, guard, not_found, page, scope_of
from speakermem.integrations.web.state import RECORDS_PAGE, STATE, render, whole_number
from speakermem.memory.console import ChannelSummary, RecordView
from speakermem.memory.models import DerivedRecord, Scope

PEOPLE_SHOWN = 100
"""People listed on a channel page (most records first)."""
SEARCH_LIMIT = 20


async def overview(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    reads = request.app[STATE].reads
    channels = await reads.channels(viewer.can.channels)
    health = None
    if viewer.can.any_admin:  # the operator sees the store's; an admin their workspaces'
        operator = viewer.session.principal.operator
        health = await reads.health(None if operator else viewer.can.admin_of)
    totals = {
        "messages": sum(c.messages for c in channels),
        "records": sum(c.records for c in channels),
    }
    return render(
        request,
        "overview.html",
        page(
            viewer,
            channels=channels,
            health=health,
            totals=totals,
            hidden=sorted(viewer.can.off_hidden, key=str),
        ),
    )


async def _channel_page(
    request: web.Request,
    viewer: Viewer,
    scope: Scope,
    *,
    query: str = "",
    search: Awaitable[list[Any]] | None = None,
) -> web.StreamResponse:
    """The channel page; with `search`, its results too, searched while the rest of the
    page is read (the two use separate reader connections)."""
    reads = request.app[STATE].reads
    searching = asyncio.ensure_future(search) if search is not None else None
    try:
        detail = await reads.channel(scope)
        if detail is None:
            raise not_found()
        people, names = await reads.record_people(scope)
        hits = await searching if searching is not None else None
    finally:
        if searching is not None and not searching.done():
            searching.cancel()
    person = request.query.get("person")
    offset = whole_number(request.query.get("page"), per=RECORDS_PAGE) * RECORDS_PAGE
    records: list[DerivedRecord] = []
    total = 0
    if person:
        records, total = await reads.person_records(
            [scope], person, limit=RECORDS_PAGE, offset=offset
        )
    return render(
        request,
        "channel.html",
        page(
            viewer,
            detail=detail,
            c=detail.summary,
            people=people[:PEOPLE_SHOWN],
            more_people=max(0, len(people) - PEOPLE_SHOWN),
            names=names,
            person=person,
            records=records,
            total=total,
            offset=offset,
            page_size=RECORDS_PAGE,
            query=query,
            hits=hits,
            admin=viewer.can.is_admin(scope.platform, scope.workspace),
        ),
    )


async def channel(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request)
    return await _channel_page(request, await guard(request, scope=scope), scope)


async def channel_search(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request)
    viewer = await guard(request, scope=scope)
    query = str(viewer.form.get("q") or "").strip()[:500]
    search = request.app[STATE].reads.search(scope, query, limit=SEARCH_LIMIT)
    return await _channel_page(request, viewer, scope, query=query, search=search)


async def channel_memory(request: web.Request) -> web.StreamResponse:
    """An admin turns memory on or off here (the same switch as `/memory channel`)."""
    scope = scope_of(request)
    viewer = await guard(request, scope=scope, admin=True)
    on = viewer.form.get("on") == "1"
    await request.app[STATE].governance.set_channel(scope, on, actor=viewer.actor())
    raise web.HTTPSeeOther(request.path.rsplit("/", 1)[0])


async def channel_graph(request: web.Request) -> web.StreamResponse:
    scope = scope_of(request)
    viewer = await guard(request, scope=scope)
    reads = request.app[STATE].reads
    summaries = await reads.channels([scope])
    if not summaries:
        raise not_found()
    graph = await reads.graph(scope)
    return render(
        request,
        "graph.html",
        page(viewer, c=summaries[0], graph=graph, drawing=layout(graph)),
    )


async def _record(request: web.Request) -> tuple[Viewer, RecordView, ChannelSummary]:
    viewer = await guard(request)
    reads = request.app[STATE].reads
    view = await reads.record(whole_number(request.match_info["record_id"], -1))
    if view is None or not viewer.can.can_read(view.record.scope):
        raise not_found()  # a record of a channel you cannot read is one that does not exist
    summaries = await reads.channels([view.record.scope])
    if not summaries:
        raise not_found()
    return viewer, view, summaries[0]


async def record(request: web.Request) -> web.StreamResponse:
    viewer, view, summary = await _record(request)
    scope = view.record.scope
    return render(
        request,
        "record.html",
        page(
            viewer,
            view=view,
            c=summary,
            admin=viewer.can.is_admin(scope.platform, scope.workspace),
        ),
    )


def record_json(view: RecordView) -> dict[str, Any]:
    rec = view.record
    return {
        "id": rec.id,
        "channel": str(rec.scope),
        "layer": rec.layer.value,
        "content": rec.content,
        "owner": rec.owner,
        "source": rec.source,
        "state": rec.state.value,
        "time": rec.time.isoformat(),
        "sources": [
            {
                "message_id": s.message_id,
                "present": s.present,
                "speaker": s.speaker_name,
                "text": s.text,
                "link": s.link,
                "deleted": s.deleted,
            }
            for s in view.sources
        ],
        "chain": [
            {"id": r.id, "content": r.content, "state": r.state.value, "time": r.time.isoformat()}
            for r in view.chain
        ],
    }


async def api_record(request: web.Request) -> web.StreamResponse:
    _viewer, view, _summary = await _record(request)
    return web.json_response(record_json(view))


async def api_channels(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    channels = await request.app[STATE].reads.channels(viewer.can.channels)
    return web.json_response(
        [
            {
                "channel": str(c.scope),
                "name": c.name,
                "on": c.on,
                "private": c.is_private,
                "messages": c.messages,
                "records": c.records,
            }
            for c in channels
        ]
    )


def add_routes(app: web.Application) -> None:
    base = "/c/{platform}/{workspace}/{channel}"
    app.router.add_get("/", overview)
    app.router.add_get(base, channel)
    app.router.add_post(base + "/search", channel_search)
    app.router.add_post(base + "/memory", channel_memory)
    app.router.add_get(base + "/graph", channel_graph)
    app.router.add_get("/records/{record_id}", record)
    app.router.add_get("/api/records/{record_id}", api_record)
    app.router.add_get("/api/channels", api_channels)

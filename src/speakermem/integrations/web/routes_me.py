"""A member's own view: what the bot holds about me in channels I can read, my export,
opt-out / opt-in and forget-me (the `/memory mine|opt-out|forget-me` commands); and Ask,
`/recall` in the browser."""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from speakermem.integrations.web.guard import Viewer, guard, not_found, page, read_form
from speakermem.integrations.web.state import STATE, render
from speakermem.memory.models import Scope
from speakermem.memory.query.answer import RecallAnswer
from speakermem.memory.query.pipeline import AccessDenied, RecallRequest

log = logging.getLogger(__name__)

MINE_LIMIT = 50


def _mine(viewer: Viewer, value: str | None) -> tuple[str, str, str]:
    """(platform, workspace, my user id) for a `platform/workspace` form value."""
    platform, _, workspace = (value or "").partition("/")
    me = viewer.user_in(platform, workspace)
    if me is None:
        raise not_found()
    return platform, workspace, me


async def me(request: web.Request) -> web.StreamResponse:
    """What the bot holds about me in the channels I can read now (`/memory mine`, cut to
    those channels: the counts too)."""
    viewer = await guard(request)
    state = request.app[STATE]
    held = []
    for m in viewer.session.principal.memberships:
        readable = viewer.can.channels_in(m.platform, m.workspace)
        records, total = await state.reads.person_records(readable, m.user_id, limit=MINE_LIMIT)
        _, messages = await state.reads.speaker_messages(readable, m.user_id, limit=0)
        held.append(
            {
                "platform": m.platform,
                "workspace": m.workspace,
                "admin": m.admin,
                "records": records,
                "total_records": total,
                "messages": messages,
                "opted_out": await state.governance.is_opted_out(
                    m.platform, m.workspace, m.user_id
                ),
            }
        )
    return render(request, "me.html", page(viewer, held=held))


def visible_export(data: dict[str, Any], channels: set[str]) -> dict[str, Any]:
    """An export cut to the channels the member can read now (fail closed: a private
    channel they left does not come back through the console)."""
    out = dict(data)
    out["messages"] = [m for m in data["messages"] if m["channel"] in channels]
    out["records"] = [r for r in data["records"] if r["channel"] in channels]
    return out


async def export(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    platform, workspace, user_id = _mine(viewer, request.query.get("w"))
    data = await request.app[STATE].governance.export_user(platform, workspace, user_id)
    channels = {s.channel for s in viewer.can.channels_in(platform, workspace)}
    body = json.dumps(visible_export(data, channels), indent=2, ensure_ascii=False)
    return web.Response(
        text=body,
        content_type="application/json",
        headers={"Content-Disposition": 'attachment; filename="speakermem-export.json"'},
    )


async def opt_out(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    platform, workspace, user_id = _mine(viewer, str(viewer.form.get("w") or ""))
    governance = request.app[STATE].governance
    if viewer.form.get("out") == "1":
        await governance.opt_out(platform, workspace, user_id, forget=False, actor=viewer.actor())
    else:
        await governance.opt_in(platform, workspace, user_id, actor=viewer.actor())
    raise web.HTTPSeeOther("/me")


async def forget_me(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    w = str(viewer.form.get("w") or "")
    _mine(viewer, w)
    return render(
        request,
        "confirm.html",
        page(
            viewer,
            title="Forget me?",
            summary=(
                "Forget your messages in this workspace and every record built from or about "
                "them. This cannot be undone."
            ),
            action="/me/forget/confirm",
            fields={"w": w},
            button="Forget me",
            back="/me",
        ),
    )


async def forget_me_confirm(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    platform, workspace, user_id = _mine(viewer, str(viewer.form.get("w") or ""))
    state = request.app[STATE]
    receipt = await state.governance.forget_user(
        platform, workspace, user_id, actor=viewer.actor(), action="forget-me"
    )
    state.reads.counts_changed()
    return render(
        request, "receipt.html", page(viewer, title="Forgotten", receipt=receipt, back="/me")
    )


# ---- Ask ----------------------------------------------------------------------------------


def _channel_arg(value: str | None) -> Scope | None:
    platform, _, rest = (value or "").partition("/")
    workspace, _, channel = rest.partition("/")
    try:
        return Scope(platform=platform, workspace=workspace, channel=channel)
    except ValueError:
        return None


async def _ask_page(
    request: web.Request,
    viewer: Viewer,
    *,
    chosen: str = "",
    question: str = "",
    answer: RecallAnswer | None = None,
    texts: dict[str, str] | None = None,
) -> web.StreamResponse:
    channels = await request.app[STATE].reads.channels(viewer.can.channels)
    return render(
        request,
        "ask.html",
        page(
            viewer,
            channels=channels,
            chosen=chosen,
            question=question,
            answer=answer,
            texts=texts or {},
            available=request.app[STATE].recaller is not None,
        ),
    )


async def ask(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    return await _ask_page(request, viewer, chosen=request.query.get("channel", ""))


async def ask_post(request: web.Request) -> web.StreamResponse:
    """Answer as `/recall` would for this person in that channel: the pipeline decides which
    channels it may draw on (the asker's roster), and refuses where they cannot read."""
    chosen = str((await read_form(request)).get("channel") or "")
    scope = _channel_arg(chosen)
    if scope is None:
        raise not_found()
    viewer = await guard(request, scope=scope)
    state = request.app[STATE]
    limit = state.reads.engine.config.recall.max_question_chars
    question = str(viewer.form.get("question") or "").strip()[:limit]
    if state.recaller is None or not question:
        return await _ask_page(request, viewer, chosen=chosen, question=question)
    asker = viewer.user_in(scope.platform, scope.workspace)
    request_ = RecallRequest(question, scope, asker=asker)
    try:
        result = await state.recaller.run(request_)
        answer = result.answer
    except AccessDenied as exc:
        answer = RecallAnswer(text=f"Sorry: {exc}.", refused=True)
    except Exception:
        log.exception("console: recall failed in %s", scope)
        answer = RecallAnswer(
            text="Sorry, something went wrong while recalling. Please try again.", refused=True
        )
    texts: dict[str, str] = {}
    for c in answer.citations:
        if viewer.can.can_read(c.scope):
            found = await state.reads.messages(c.scope, [c.message_id])
            if c.message_id in found:
                texts[f"{c.scope}/{c.message_id}"] = found[c.message_id].text
    return await _ask_page(
        request, viewer, chosen=chosen, question=question, answer=answer, texts=texts
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/me", me)
    app.router.add_get("/me/export.json", export)
    app.router.add_post("/me/opt-out", opt_out)
    app.router.add_post("/me/forget", forget_me)
    app.router.add_post("/me/forget/confirm", forget_me_confirm)
    app.router.add_get("/ask", ask)
    app.router.add_post("/ask", ask_post)

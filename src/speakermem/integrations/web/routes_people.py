"""People and governance: the roster, a person's aliases, opt-out and derived records, an
admin forgetting a person or a message (confirmation first, then the receipt), the audit log.

Every change goes through `Governance`: the forgetting cascade, the audit log and the
receipts are the ones the CLI and `/memory` use."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from speakermem.integrations.web.guard import Viewer, guard, not_found, page, read_form
from speakermem.integrations.web.state import RECORDS_PAGE, STATE, render, whole_number
from speakermem.memory.governance.service import GovernanceError
from speakermem.memory.models import Scope

PEOPLE_PAGE = 50
MESSAGES_SHOWN = 20
AUDIT_LIMIT = 200


def _workspace_arg(viewer: Viewer, value: str | None) -> tuple[str, str]:
    """`platform/workspace` from a query, or the viewer's only (first) workspace."""
    if value:
        platform, _, workspace = value.partition("/")
        if not viewer.can.sees_workspace(platform, workspace):
            raise not_found()
        return platform, workspace
    if not viewer.can.workspaces:
        raise not_found()
    return viewer.can.workspaces[0]


async def people(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request)
    if not viewer.can.workspaces:
        return render(request, "people.html", page(viewer, ws=None, rows=[], total=0, q=""))
    platform, workspace = _workspace_arg(viewer, request.query.get("w"))
    q = (request.query.get("q") or "").strip()[:100]
    offset = whole_number(request.query.get("page"), per=PEOPLE_PAGE) * PEOPLE_PAGE
    admin = viewer.can.is_admin(platform, workspace)
    within = None if admin else viewer.can.channels_in(platform, workspace)
    rows, total = await request.app[STATE].reads.people(
        platform, workspace, query=q, within=within, limit=PEOPLE_PAGE, offset=offset
    )
    return render(
        request,
        "people.html",
        page(
            viewer,
            ws=(platform, workspace),
            rows=rows,
            total=total,
            q=q,
            offset=offset,
            page_size=PEOPLE_PAGE,
            admin=admin,
        ),
    )


async def people_find(request: web.Request) -> web.StreamResponse:
    """The people search form: back to the list, filtered (post, redirect, get)."""
    viewer = await guard(request)
    w = str(viewer.form.get("w") or "")
    platform, workspace = _workspace_arg(viewer, w)
    q = str(viewer.form.get("q") or "").strip()[:100]
    raise web.HTTPSeeOther(f"/people?{urlencode({'w': f'{platform}/{workspace}', 'q': q})}")


async def _person_target(
    request: web.Request, *, admin: bool = False
) -> tuple[Viewer, str, str, str]:
    platform = request.match_info["platform"]
    workspace = request.match_info["workspace"]
    user_id = request.match_info["user_id"]
    viewer = await guard(request, workspace=(platform, workspace), admin=admin)
    if not viewer.can.is_admin(platform, workspace) and user_id != viewer.user_in(
        platform, workspace
    ):
        visible = viewer.can.channels_in(platform, workspace)
        if not await request.app[STATE].reads.on_roster(visible, user_id):
            raise not_found()  # someone in none of your channels is nobody you can look up
    return viewer, platform, workspace, user_id


async def person(request: web.Request) -> web.StreamResponse:
    viewer, platform, workspace, user_id = await _person_target(request)
    reads = request.app[STATE].reads
    found = await reads.person(platform, workspace, user_id)
    visible = viewer.can.channels_in(platform, workspace)
    offset = whole_number(request.query.get("page"), per=RECORDS_PAGE) * RECORDS_PAGE
    records, total = await reads.person_records(visible, user_id, limit=RECORDS_PAGE, offset=offset)
    messages, message_total = await reads.speaker_messages(visible, user_id, limit=MESSAGES_SHOWN)
    names: dict[str, str] = {}
    for scope in {r.scope for r in records}:
        names.update(await reads.names(scope))
    return render(
        request,
        "person.html",
        page(
            viewer,
            ws=(platform, workspace),
            user_id=user_id,
            person=found,
            records=records,
            total=total,
            offset=offset,
            page_size=RECORDS_PAGE,
            names=names,
            messages=messages,
            message_total=message_total,
            admin=viewer.can.is_admin(platform, workspace),
        ),
    )


def _label(found: Any, user_id: str) -> str:
    return found.display_name if found is not None and found.display_name else user_id


async def forget_person(request: web.Request) -> web.StreamResponse:
    """The confirmation step: what will be forgotten, and a button that does it."""
    viewer, platform, workspace, user_id = await _person_target(request, admin=True)
    found = await request.app[STATE].reads.person(platform, workspace, user_id)
    label = _label(found, user_id)
    return render(
        request,
        "confirm.html",
        page(
            viewer,
            title=f"Forget {label}?",
            summary=(
                f"Forget {label}: every message they wrote in this workspace, every record "
                "built from or about them, their name and aliases. This cannot be undone."
            ),
            action=request.path + "/confirm",
            fields={},
            button=f"Forget {label}",
            back=request.path.rsplit("/", 1)[0],
        ),
    )


async def forget_person_confirm(request: web.Request) -> web.StreamResponse:
    viewer, platform, workspace, user_id = await _person_target(request, admin=True)
    state = request.app[STATE]
    found = await state.reads.person(platform, workspace, user_id)
    receipt = await state.governance.forget_user(platform, workspace, user_id, actor=viewer.actor())
    return render(
        request,
        "receipt.html",
        page(viewer, title=f"Forgot {_label(found, user_id)}", receipt=receipt, back="/people"),
    )


async def _message_target(request: web.Request) -> tuple[Viewer, Scope, str]:
    form = await read_form(request)
    try:
        scope = Scope(
            platform=str(form.get("platform") or ""),
            workspace=str(form.get("workspace") or ""),
            channel=str(form.get("channel") or ""),
        )
    except ValueError:
        raise not_found() from None
    viewer = await guard(request, scope=scope, admin=True)
    message_id = str(viewer.form.get("message_id") or "").strip()
    if not message_id:
        raise not_found()
    return viewer, scope, message_id


async def forget_message(request: web.Request) -> web.StreamResponse:
    viewer, scope, message_id = await _message_target(request)
    found = await request.app[STATE].reads.messages(scope, [message_id])
    if message_id not in found:
        raise not_found()
    m = found[message_id]
    fields = {
        "platform": scope.platform,
        "workspace": scope.workspace,
        "channel": scope.channel,
        "message_id": message_id,
    }
    return render(
        request,
        "confirm.html",
        page(
            viewer,
            title="Forget this message?",
            summary=(
                f"Forget {m.speaker_name}'s message “{m.text[:200]}” and every record derived "
                "from it. This cannot be undone."
            ),
            action="/messages/forget/confirm",
            fields=fields,
            button="Forget the message",
            back=f"/c/{scope.platform}/{scope.workspace}/{scope.channel}",
        ),
    )


async def forget_message_confirm(request: web.Request) -> web.StreamResponse:
    viewer, scope, message_id = await _message_target(request)
    state = request.app[STATE]
    try:
        receipt = await state.governance.forget_message(scope, message_id, actor=viewer.actor())
    except GovernanceError:
        raise not_found() from None
    state.reads.counts_changed()
    return render(
        request,
        "receipt.html",
        page(
            viewer,
            title="Message forgotten",
            receipt=receipt,
            back=f"/c/{scope.platform}/{scope.workspace}/{scope.channel}",
        ),
    )


async def audit(request: web.Request) -> web.StreamResponse:
    viewer = await guard(request, admin=True)
    governance = request.app[STATE].governance
    if viewer.session.principal.operator:
        entries = await governance.audit(AUDIT_LIMIT)
    else:
        by_id: dict[int, dict[str, Any]] = {}
        for platform, workspace in sorted(viewer.can.admin_of):
            for e in await governance.audit(AUDIT_LIMIT, platform=platform, workspace=workspace):
                by_id[e["id"]] = e
        entries = sorted(by_id.values(), key=lambda e: e["id"], reverse=True)[:AUDIT_LIMIT]
    return render(request, "audit.html", page(viewer, entries=entries))


def add_routes(app: web.Application) -> None:
    person_path = "/people/{platform}/{workspace}/{user_id}"
    app.router.add_get("/people", people)
    app.router.add_post("/people/find", people_find)
    app.router.add_get(person_path, person)
    app.router.add_post(person_path + "/forget", forget_person)
    app.router.add_post(person_path + "/forget/confirm", forget_person_confirm)
    app.router.add_post("/messages/forget", forget_message)
    app.router.add_post("/messages/forget/confirm", forget_message_confirm)
    app.router.add_get("/audit", audit)

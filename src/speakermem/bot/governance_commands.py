"""Run `/memory` subcommands for a platform invocation: permission, confirmation, replies.

The parsing is pure (`bot.governance`); the work is `memory.governance.Governance`. This
module decides who may do what and renders the outcome as a `CommandReply`. It runs for a
`CommandHost` (the dispatcher) and knows nothing else of it.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any, Protocol

from speakermem.bot.events import CommandInvocation
from speakermem.bot.governance import (
    AliasChange,
    Audit,
    ChannelSwitch,
    CommandReply,
    CommandSyntaxError,
    ConfirmPrompt,
    ExportUser,
    ForgetLift,
    ForgetMe,
    ForgetMessage,
    ForgetUser,
    Help,
    MemoryCommand,
    Mine,
    OptIn,
    OptOut,
    PendingActions,
    RetentionSet,
    Status,
    UserRef,
    help_text,
    is_admin_only,
    is_destructive,
    parse_memory_command,
)
from speakermem.bot.progress import cursor_line
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.policy import Receipt
from speakermem.memory.governance.service import Governance, GovernanceError
from speakermem.memory.models import Scope


class Counted(Protocol):
    """The dispatcher's counters (`DispatchStats`): what `/memory` ran or refused."""

    @property
    def handled(self) -> Counter[str]: ...


class CommandHost(Protocol):
    """What `/memory` needs of the dispatcher that runs it (bot.dispatch.Dispatcher)."""

    @property
    def engine(self) -> MemoryEngine: ...

    @property
    def governance(self) -> Governance: ...

    @property
    def pending(self) -> PendingActions:
        """Destructive actions waiting for their requester's confirmation."""
        ...

    @property
    def stats(self) -> Counted: ...

    def maybe_notice(self, scope: Scope) -> None:
        """Post the channel's one-time memory notice (memory was just switched on)."""
        ...


ADMIN_REFUSAL = (
    "Sorry, `/memory {name}` is for workspace admins (Discord: Manage Server or "
    "Administrator; Slack: workspace admins and owners). Nothing was changed."
)


def fmt_ts(ts: float | None) -> str:
    if ts is None:
        return "never"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def receipt_reply(prefix: str, receipt: Receipt) -> CommandReply:
    return CommandReply(
        text=f"{prefix} Receipt: {receipt.summary()}.",
        data={"receipt": receipt.model_dump()},
    )


async def run_memory_command(d: CommandHost, inv: CommandInvocation) -> CommandReply:
    line = inv.text or inv.options.get("command", "")
    try:
        cmd = parse_memory_command(line)
    except CommandSyntaxError as exc:
        return CommandReply(text=f"{exc}. Try `/memory help`.", refused=True)
    if isinstance(cmd, Help):
        return CommandReply(text=help_text(is_admin=inv.is_admin))
    if is_admin_only(cmd) and not inv.is_admin:
        d.stats.handled["memory_refused"] += 1
        return CommandReply(text=ADMIN_REFUSAL.format(name=cmd.name), refused=True)
    try:
        context = await _resolve(d, cmd, inv)
        if is_destructive(cmd):
            action = d.pending.add(
                user_id=inv.user_id,
                platform=inv.scope.platform,
                workspace=inv.scope.workspace,
                command=cmd,
                context=context,
                admin_required=is_admin_only(cmd),
            )
            summary = context["summary"]
            return CommandReply(
                text=f"{summary} This cannot be undone. Confirm within "
                f"{int(d.pending.ttl_s // 60)} minutes.",
                confirm=ConfirmPrompt(
                    token=action.token, summary=summary, confirm_label=context["label"]
                ),
            )
        return await _execute(d, cmd, context, inv.scope)
    except GovernanceError as exc:
        return CommandReply(text=f"{exc}.", refused=True)


async def run_confirmed(
    d: CommandHost, token: str, *, user_id: str, is_admin: bool, accept: bool
) -> CommandReply:
    taken = d.pending.take(token, user_id=user_id)
    if isinstance(taken, str):
        return CommandReply(text=f"Sorry, {taken}.", refused=True)
    if not accept:
        return CommandReply(text="Cancelled; nothing was changed.")
    if taken.admin_required and not is_admin:
        d.stats.handled["memory_refused"] += 1
        return CommandReply(
            text="Sorry, you are no longer an admin here, so I did not run that. "
            "Nothing was changed.",
            refused=True,
        )
    scope: Scope = taken.context["scope"]
    try:
        return await _execute(d, taken.command, taken.context, scope)
    except GovernanceError as exc:
        return CommandReply(text=f"{exc}.", refused=True)


async def _user_id(d: CommandHost, scope: Scope, ref: UserRef) -> str:
    return await d.governance.resolve_user(
        scope.platform, scope.workspace, ref.value, is_id=ref.kind == "id"
    )


async def _resolve(d: CommandHost, cmd: MemoryCommand, inv: CommandInvocation) -> dict[str, Any]:
    """Targets resolved before anything runs (so a prompt names them and errors come early)."""
    scope = inv.scope
    ctx: dict[str, Any] = {
        "scope": scope,
        "actor": f"{scope.platform}:{inv.user_id}",
        "user_id": inv.user_id,
        "readable": inv.readable_channels,
        "label": "Confirm",
        "summary": "",
    }
    if isinstance(cmd, AliasChange | ForgetUser | ForgetLift | ExportUser):
        ctx["target"] = await _user_id(d, scope, cmd.user)
        ctx["target_label"] = str(cmd.user) if cmd.user.kind == "name" else f"<@{ctx['target']}>"
    if isinstance(cmd, ForgetUser):
        ctx["label"] = "Forget"
        ctx["summary"] = (
            f"Forget {ctx['target_label']}: every message they wrote in this workspace, every "
            "record built from or about them, their name and aliases."
        )
    elif isinstance(cmd, ForgetMessage):
        ref = cmd.ref
        if ref.platform is not None and ref.platform != scope.platform:
            raise GovernanceError(f"that is a {ref.platform} link; I can only forget here")
        if ref.workspace is not None and ref.workspace != scope.workspace:
            raise GovernanceError("that message is in another workspace")
        ctx["message_scope"] = await d.governance.locate_message(
            scope.platform, scope.workspace, ref.channel or scope.channel, ref.message_id
        )
        ctx["message_id"] = ref.message_id
        ctx["label"] = "Forget"
        ctx["summary"] = (
            f"Forget message {ref.message_id} in {ctx['message_scope'].channel} and every record "
            "derived from it."
        )
    elif isinstance(cmd, ChannelSwitch) and cmd.purge:
        ctx["label"] = "Purge"
        ctx["summary"] = (
            "Turn memory off in this channel and forget everything it holds (messages and "
            "the records built from them)."
        )
    elif isinstance(cmd, OptOut) and cmd.forget:
        ctx["label"] = "Forget me"
        ctx["summary"] = (
            "Stop storing your messages and forget what I hold: your messages in this "
            "workspace and every record built from or about them."
        )
    elif isinstance(cmd, ForgetMe):
        ctx["label"] = "Forget me"
        ctx["summary"] = (
            "Forget your messages in this workspace and every record built from or about them."
        )
    return ctx


async def _execute(
    d: CommandHost, cmd: MemoryCommand, ctx: dict[str, Any], scope: Scope
) -> CommandReply:
    gov = d.governance
    actor: str = ctx["actor"]
    me: str = ctx["user_id"]
    plat, ws = scope.platform, scope.workspace
    d.stats.handled[f"memory_{cmd.name}"] += 1
    if isinstance(cmd, ChannelSwitch):
        if cmd.purge:
            receipt = await gov.purge_channel(scope, actor=actor)
            return receipt_reply(
                "Memory is off in this channel and its history is forgotten.", receipt
            )
        receipt = await gov.set_channel(scope, cmd.on, actor=actor)
        if cmd.on:
            d.maybe_notice(scope)
            return CommandReply(text="Memory is on in this channel.")
        return CommandReply(
            text="Memory is off in this channel: nothing new is stored and /recall answers "
            "nothing here. What it already holds stays until purged "
            "(`/memory channel off purge`).",
            data={"receipt": receipt.model_dump()},
        )
    if isinstance(cmd, RetentionSet):
        channel = None if cmd.workspace else scope.channel
        await gov.set_retention(plat, ws, channel, cmd.days, actor=actor)
        where = "this workspace" if cmd.workspace else "this channel"
        if cmd.days is None:
            return CommandReply(text=f"Retention is off for {where}: messages are kept.")
        return CommandReply(
            text=f"Messages in {where} are kept {cmd.days} days; older ones (and the records "
            "built from them) are forgotten at the next daily run."
        )
    if isinstance(cmd, AliasChange):
        receipt = await gov.alias(plat, ws, ctx["target"], cmd.alias, add=cmd.add, actor=actor)
        verb = "now also goes by" if cmd.add else "no longer goes by"
        if not receipt.counts:
            return CommandReply(
                text=f"Nothing changed: {ctx['target_label']} "
                f"{'already has' if cmd.add else 'has no'} alias {cmd.alias!r}."
            )
        return CommandReply(text=f"{ctx['target_label']} {verb} {cmd.alias!r}.")
    if isinstance(cmd, ForgetMessage):
        receipt = await gov.forget_message(ctx["message_scope"], ctx["message_id"], actor=actor)
        return receipt_reply("Forgotten.", receipt)
    if isinstance(cmd, ForgetUser):
        receipt = await gov.forget_user(plat, ws, ctx["target"], actor=actor)
        return receipt_reply(f"Forgot {ctx['target_label']}.", receipt)
    if isinstance(cmd, ForgetLift):
        receipt = await gov.lift_forget(plat, ws, ctx["target"], actor=actor)
        return receipt_reply(
            f"{ctx['target_label']} is remembered again from now on (what was forgotten "
            "stays forgotten).",
            receipt,
        )
    if isinstance(cmd, ExportUser):
        # only what lies in channels the requesting admin can read (fail closed: none)
        asked = ctx.get("readable")
        can_read = (
            await d.engine.readable_channels(plat, ws, me)
            if asked is None
            else [Scope(platform=plat, workspace=ws, channel=c) for c in asked]
        )
        data = await gov.export_user(plat, ws, ctx["target"], readable=can_read)
        await d.engine.admin.log(
            platform=plat, workspace=ws, actor=actor, action="export-user", target=ctx["target"]
        )
        withheld = data["withheld"]
        hidden = (
            f" ({withheld['messages']} messages and {withheld['records']} records are in "
            "channels you cannot read and are left out)"
            if withheld["messages"] or withheld["records"]
            else ""
        )
        return CommandReply(
            text=f"Export of {ctx['target_label']}: {len(data['messages'])} messages and "
            f"{len(data['records'])} records (JSON attached){hidden}.",
            data=data,
        )
    if isinstance(cmd, Status):
        return render_status(await gov.status(plat, ws))
    if isinstance(cmd, Audit):
        entries = await gov.audit(cmd.limit, platform=plat, workspace=ws)
        lines = [
            f"• {fmt_ts(e['at'])} {e['actor']} {e['action']} {e['target']}: "
            f"{Receipt(action=e['action'], counts=e['receipt']).summary()}"
            for e in entries
        ]
        return CommandReply(
            text="\n".join(["*Latest admin actions*", *lines])
            if lines
            else "No admin actions yet.",
            data={"audit": entries},
        )
    if isinstance(cmd, Mine):
        readable = ctx.get("readable")
        scopes = (
            None
            if readable is None
            else [Scope(platform=plat, workspace=ws, channel=c) for c in readable]
        )
        data = await gov.mine(plat, ws, me, readable=scopes)
        return render_mine(data)
    if isinstance(cmd, OptOut):
        receipt = await gov.opt_out(plat, ws, me, forget=cmd.forget, actor=actor)
        if cmd.forget:
            return receipt_reply(
                "You are opted out and what I held about you is forgotten.", receipt
            )
        return CommandReply(
            text="You are opted out: I no longer store your messages. What I already hold "
            "stays; `/memory forget-me` removes it."
        )
    if isinstance(cmd, OptIn):
        await gov.opt_in(plat, ws, me, actor=actor)
        return CommandReply(text="You are opted in: I store your messages again.")
    if isinstance(cmd, ForgetMe):
        receipt = await gov.forget_user(plat, ws, me, actor=actor, action="forget-me")
        return receipt_reply("Forgotten.", receipt)
    return CommandReply(text=help_text(is_admin=False))  # pragma: no cover - Help handled


def render_status(s: dict[str, Any]) -> CommandReply:
    q = s["writer_queue"]
    llm = {True: "reachable", False: "NOT reachable", None: "not configured"}[s["llm_reachable"]]
    on = [c for c in s["channels"] if c["on"]]
    off = [c for c in s["channels"] if not c["on"]]
    lines = [
        "*Memory status*",
        f"• {s['messages']} messages, {s['records_active']} active records",
        f"• Writer queue: {q['pending_segments']} segments pending, {q['rederive']} records "
        f"to re-derive; last run {fmt_ts(s['writer_last_run'])}",
        f"• {writer_lines(s)}",
        f"• LLM: {llm}",
        f"• Database: {s['db_bytes'] / 1e6:.1f} MB",
        f"• Channels on: {_names(on)}",
        f"• Channels off: {_names(off)}",
        f"• New channels: {'on' if s['default_channel_on'] else 'off'} by default",
    ]
    lines += [f"• History: {cursor_line(c)}" for c in s.get("catchup", [])]
    lines += [
        f"• A forget is INCOMPLETE ({j['action']} #{j['id']}): it is retried automatically"
        for j in s.get("forgets_incomplete", [])
    ]
    return CommandReply(text="\n".join(lines), data={"status": s})


def writer_lines(s: dict[str, Any]) -> str:
    """The Writer's backlog age and what its LLM calls cost, from `Governance.status()`."""
    q, u = s["writer_queue"], s.get("writer_usage") or {}
    age = q.get("oldest_pending_age_s")
    waiting = "nothing waiting" if age is None else f"oldest pending segment {age:.0f} s old"
    cost = f", ${u['cost_usd']:.4f} in all" if u.get("cost_usd") else ""
    return (
        f"Writer backlog: {waiting}, {q.get('deferred_segments', 0)} deferred; "
        f"{u.get('tokens_per_run', 0):.0f} tokens per run, "
        f"{u.get('tokens_per_1k_messages', 0):.0f} per 1,000 messages{cost}"
    )


def _names(channels: list[dict[str, Any]]) -> str:
    return ", ".join(c["name"] or c["channel"].rsplit("/", 1)[-1] for c in channels) or "-"


def render_mine(data: dict[str, Any]) -> CommandReply:
    lines = [
        f"I hold {data['messages']} of your messages and {data['total_records']} records "
        "about you" + (" (you are opted out)" if data["opted_out"] else "") + "."
    ]
    for rec in data["records"]:
        links = " ".join(f"<{link}>" for link in rec["links"] if link)
        lines.append(f"• {rec['content']} {links}".rstrip())
    if data["total_records"] > len(data["records"]):
        lines.append(f"…and {data['total_records'] - len(data['records'])} more.")
    lines.append("`/memory forget-me` forgets them; `/memory opt-out` stops storing you.")
    return CommandReply(text="\n".join(lines), data=data)

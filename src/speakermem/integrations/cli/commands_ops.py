"""Operations commands: `speakermem backup PATH` and `speakermem backfill`.

`backfill` is the admin's way to bring older history into memory: the same machinery as
the bot's catch-up after downtime (bot.catchup.CatchUp, kind "backfill"), reading one
channel's history from a date through the platform's API with the bot token, feeding it
through the dispatcher (governance and idempotency as for live messages: a message already
stored is counted, not stored twice) and saving a cursor after every page, so an
interrupted backfill resumes where it stopped when run again.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speakermem.bot.settings import Settings
from speakermem.integrations.cli.errors import CliError
from speakermem.integrations.cli.render import advance, err_console, progress_bar

if TYPE_CHECKING:
    from speakermem.bot.catchup import HistorySource, Start
    from speakermem.memory.engine import MemoryEngine
    from speakermem.memory.models import Scope

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction, common: Any) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "backup",
        help="take a consistent online copy of the database (safe while the bot runs)",
        description="Copy the database with SQLite's VACUUM INTO: one consistent snapshot, "
        "compacted, integrity-checked, then renamed into PATH. The bot may keep running. "
        "Restore: stop the bot, copy the backup over the database file, delete its -wal and "
        "-shm files, start the bot. With SPEAKERMEM_DB_URL (PostgreSQL): pg_dump "
        "--format=custom of one snapshot (pg_dump must be on PATH); restore into an empty "
        "database with pg_restore --clean --if-exists --no-owner --dbname URL PATH.",
    )
    common(p)
    p.add_argument("path", type=Path, help="where to write the copy (must not exist)")
    p.set_defaults(handler="speakermem.integrations.cli.commands_ops:cmd_backup")

    p = sub.add_parser(
        "backfill",
        help="fetch a channel's older history into memory (admin action, resumable)",
        description="Read one channel's history since DATE from Slack (conversations.history "
        "and thread replies, with SPEAKERMEM_SLACK_BOT_TOKEN) or Discord (REST channel "
        "history, with SPEAKERMEM_DISCORD_TOKEN; no gateway connection) and store it like "
        "live messages: channels switched off and opted-out members are skipped, messages "
        "already stored are not stored again. Rate limits are waited out. Interrupted? Run "
        "the same command again: it resumes from the last page it saved. Safe while the bot "
        "runs.",
        epilog="example: speakermem backfill --platform slack --channel C0123ABCD "
        "--since 2024-01-01",
    )
    common(p)
    p.add_argument(
        "--platform",
        choices=["slack", "discord"],
        required=True,
        help="where the channel is (its bot token must be set)",
    )
    p.add_argument(
        "--channel",
        required=True,
        metavar="C",
        help="channel id (Slack C…/G…, Discord snowflake; a Discord thread id works too)",
    )
    p.add_argument(
        "--since",
        required=True,
        metavar="DATE",
        type=parse_since,
        help="fetch messages after this moment: YYYY-MM-DD or an ISO date-time (UTC unless "
        "it has an offset)",
    )
    p.add_argument(
        "--workspace",
        default=None,
        metavar="W",
        help="Slack team id / Discord server id (default: the bot's team / the channel's server)",
    )
    p.add_argument("--no-embed", action="store_true", help="skip embedding the new messages")
    p.set_defaults(handler="speakermem.integrations.cli.commands_ops:cmd_backfill")


async def cmd_backup(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.memory import maintenance
    from speakermem.memory.engine import StoreError

    config = settings.memory_config().store
    postgres = config.db_url is not None
    try:
        result = await maintenance.backup(config, Path(args.path))
    except StoreError as exc:
        raise CliError(str(exc)) from exc
    check = "pg_dump archive listed ok" if postgres else "integrity ok"
    err_console.print(
        f"backup written to {result.path}: {result.bytes:,} bytes, {result.messages:,} "
        f"messages, {result.records:,} records, {check} ({result.seconds:.1f} s)",
        markup=False,
    )
    return 0


# ---- backfill ---------------------------------------------------------------------------


def parse_since(text: str) -> datetime:
    """`--since`: a date or ISO date-time; naive values are UTC."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not a date: {text!r} (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)"
        ) from exc
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _token(value: Any, env: str, why: str) -> str:
    raw = value.get_secret_value().strip() if value is not None else ""
    if not raw:
        raise CliError(f"{env} is not set: {why}")
    return str(raw)


@contextlib.asynccontextmanager
async def _slack_source(
    settings: Settings, engine: MemoryEngine, channel: str, workspace: str | None
) -> AsyncIterator[tuple[HistorySource, Scope, str | None]]:
    from slack_sdk.errors import SlackApiError, SlackClientError
    from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
    from slack_sdk.web.async_client import AsyncWebClient

    from speakermem.integrations.slack.history import SlackHistory
    from speakermem.integrations.slack.roster_sync import SlackDirectory, sync_channel_roster
    from speakermem.integrations.slack.translate import PLATFORM
    from speakermem.memory.models import Scope

    token = _token(
        settings.slack_bot_token,
        "SPEAKERMEM_SLACK_BOT_TOKEN",
        "backfill reads Slack history with the bot token (scopes channels:history, groups:history)",
    )
    client = AsyncWebClient(token=token, base_url=settings.slack_api_url)
    client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=3))
    try:
        auth = await client.auth_test()
    except (SlackApiError, SlackClientError, OSError) as exc:
        raise CliError(f"Slack rejected the bot token or could not be reached ({exc})") from exc
    team = workspace or auth.get("team_id")
    if not isinstance(team, str) or not team:
        raise CliError("Slack did not say which workspace the token is for; pass --workspace")
    try:
        info = await client.conversations_info(channel=channel)
    except SlackApiError as exc:
        error = exc.response.get("error") if exc.response is not None else None
        raise CliError(
            f"Slack does not know channel {channel!r} ({error or exc}): give the channel id "
            "(C… or G…, from the channel's details), and invite the bot to private channels"
        ) from exc
    meta = info.get("channel") or {}
    name = meta.get("name") if isinstance(meta.get("name"), str) else None
    scope = Scope(platform=PLATFORM, workspace=team, channel=channel)
    directory = SlackDirectory(client)
    try:  # who may /recall what is backfilled: the channel's members, as the adapter keeps them
        await sync_channel_roster(engine, directory, scope)
    except (SlackApiError, SlackClientError, OSError) as exc:
        err_console.print(f"warning: could not list the channel's members ({exc})", markup=False)
    private = meta.get("is_private") or meta.get("is_im") or meta.get("is_mpim")
    await engine.set_channel_meta(scope, name=name, is_private=bool(private))

    async def names(team_id: str, user_id: str) -> tuple[str, bool] | None:
        await directory.ensure(team_id)
        return directory.get(team_id, user_id)

    yield SlackHistory(client, names=names), scope, name


@contextlib.asynccontextmanager
async def _discord_source(
    settings: Settings, channel: str, workspace: str | None
) -> AsyncIterator[tuple[HistorySource, Scope, str | None]]:
    import discord

    from speakermem.integrations.discord.adapter import discord_endpoints
    from speakermem.integrations.discord.history import DiscordHistory
    from speakermem.integrations.discord.translate import PLATFORM
    from speakermem.memory.models import Scope

    token = _token(
        settings.discord_token,
        "SPEAKERMEM_DISCORD_TOKEN",
        "backfill reads Discord history with the bot token (Read Message History in the channel)",
    )
    if not channel.isdigit():
        raise CliError(f"--channel must be a numeric Discord channel id, not {channel!r}")
    with discord_endpoints(settings):
        client = discord.Client(intents=discord.Intents.none())
        async with client:
            try:
                await client.login(token)  # REST only: the gateway is never connected
            except discord.LoginFailure as exc:
                raise CliError("Discord rejected the token (SPEAKERMEM_DISCORD_TOKEN)") from exc
            try:
                data: dict[str, Any] = dict(await client.http.get_channel(int(channel)))
            except (discord.NotFound, discord.Forbidden) as exc:
                raise CliError(
                    f"Discord does not show channel {channel} to the bot ({exc.status}): check "
                    "the id and that the bot can view the channel"
                ) from exc
            guild = workspace or data.get("guild_id")
            if not guild:
                raise CliError(f"channel {channel} is not in a server (a DM?): nothing to do")
            parents: dict[str, str] = {}
            name = data.get("name") if isinstance(data.get("name"), str) else None
            if data.get("type") in (10, 11, 12) and data.get("parent_id"):
                parents[channel] = str(data["parent_id"])  # a thread: stored in its channel
                channel, name = parents[channel], None
            scope = Scope(platform=PLATFORM, workspace=str(guild), channel=channel)
            yield DiscordHistory(client, parents=lambda _gid: parents), scope, name


async def cmd_backfill(settings: Settings, args: argparse.Namespace) -> int:
    from speakermem.bot.catchup import CatchUp
    from speakermem.bot.dispatch import Dispatcher
    from speakermem.bot.progress import ChannelProgress
    from speakermem.integrations.app import open_engine
    from speakermem.integrations.cli.governance import governance
    from speakermem.integrations.cli.ingest import embed_all
    from speakermem.memory.query.pipeline import RecallPipeline

    since: datetime = args.since
    async with open_engine(settings, with_embedder=not args.no_embed) as engine:
        source_cm = (
            _slack_source(settings, engine, args.channel, args.workspace)
            if args.platform == "slack"
            else _discord_source(settings, args.channel, args.workspace)
        )
        async with source_cm as (source, scope, name):
            if name:
                await engine.set_channel_meta(scope, name=name, is_private=None)
            gov = governance(settings, engine)
            if not await gov.channel_enabled(scope):
                raise CliError(
                    f"memory is off in {scope}: nothing would be stored (switch it on first: "
                    f"speakermem channel enable {scope.channel})"
                )
            start: Start = (None, since.timestamp())
            for cur in await engine.cursors.cursors(scope.platform, "backfill"):
                if (
                    cur.scope == scope
                    and not cur.finished
                    and cur.cursor_ts is not None
                    and cur.cursor_ts >= since.timestamp()
                ):
                    start = (cur.cursor_id, cur.cursor_ts)
                    err_console.print(
                        f"resuming an interrupted backfill after {cur.fetched:,} messages",
                        markup=False,
                    )
            dispatcher = Dispatcher(engine, RecallPipeline(engine), governance=gov)
            label = f"backfill #{name}" if name else f"backfill {scope.channel}"
            with progress_bar(label, None) as bar:
                on_page: Callable[[ChannelProgress, int], None] = lambda _p, n: advance(bar, n)  # noqa: E731
                runner = CatchUp(
                    dispatcher, engine.cursors, source, kind="backfill", on_page=on_page
                )
                (prog,) = await runner.run({scope: start}, {scope: name} if name else None)
            await dispatcher.drain_notices()
        handled, ignored = dispatcher.stats.handled, dispatcher.stats.ignored
        embedded = 0 if args.no_embed else await embed_all(engine)
    err_console.print(prog.line(), markup=False, highlight=False)
    skipped = sum(ignored.values())
    err_console.print(
        f"stored {handled['message_stored']:,} new messages, "
        f"{handled['message_duplicate']:,} already present, {skipped:,} skipped "
        f"(bots, opted-out or forgotten members); embedded {embedded:,}",
        markup=False,
        highlight=False,
    )
    if prog.error:
        raise CliError(f"backfill stopped ({prog.error}); run the same command to resume")
    return 0

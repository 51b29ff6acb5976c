"""The bodies of `speakermem demo` and `speakermem shell` (their options: cli/commands_demo.py).

Both use `./speakermem-demo.db` unless --db or SPEAKERMEM_DB_PATH names another file, so
trying the demo never touches the bot's own database.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TextIO

from speakermem.bot.settings import Settings
from speakermem.integrations.shell import demo
from speakermem.integrations.shell.adapter import ShellAdapter, line_source
from speakermem.integrations.shell.render import render_answer
from speakermem.integrations.shell.session import LocalBot, local_bot, local_settings
from speakermem.integrations.shell.translate import DEFAULT_CHANNEL
from speakermem.memory.query.pipeline import RecallResult
from speakermem.memory.url_masking import mask_url

NO_LLM_HINT = (
    "No LLM is configured, so the Writer does not run on new messages: they are kept "
    "verbatim, searched lexically and densely, and answers are extractive. To let the Writer "
    "build System 2 (who thinks what about whom, and how it changed), point "
    "SPEAKERMEM_LLM_BASE_URL at an OpenAI-compatible endpoint, e.g.\n"
    "  SPEAKERMEM_LLM_BASE_URL=http://localhost:11434/v1 SPEAKERMEM_LLM_MODEL=qwen2.5:7b-instruct "
    "SPEAKERMEM_LLM_STRUCTURED_MODE=json_object speakermem demo\n"
    "(docs/guides/writer-model.md: which model, and where to run it)."
)


def _quiet_logs(args: argparse.Namespace) -> None:
    """Keep INFO logs out of the chat unless --log-level asked for them."""
    if getattr(args, "log_level", None) is None:
        logging.getLogger().setLevel(logging.WARNING)


def explain_summary(result: RecallResult) -> str:
    """One or two lines of --explain: what the question was read as and where evidence came from."""
    t = result.trace
    p = t.projection
    rows = ", ".join(p.get("rows") or []) or "-"
    rankings = ", ".join(f"{k} {v}" for k, v in t.rankings.items())
    total_ms = sum(t.latency_ms.values())
    return (
        f"explain: read as issue {p.get('issue')!r}, rows {rows}, tense {p.get('tense')} "
        f"({p.get('method', '?')}); rankings {rankings}; select {t.select}; "
        f"S1 evidence {len(t.s1_evidence)}, S2 rows {len(t.s2_rows)}; {total_ms:.0f} ms"
    )


async def _texts(bot: LocalBot, result: RecallResult) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for c in result.answer.citations:
        found = await bot.engine.messages_by_id(c.scope, [c.message_id])
        if c.message_id in found:
            out[(c.scope.channel, c.message_id)] = found[c.message_id].text
    return out


async def run_demo(bot: LocalBot, out: TextIO) -> list[tuple[demo.DemoExample, RecallResult]]:
    """Load, build and ask; print what happened. Returns the answers (tests check them)."""

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    conv = demo.load_conversation()
    say(f"Demo: {conv.title}")
    people = ", ".join(f"{p.name} ({p.role})" for p in conv.people)
    say(f"People: {people}")
    say(
        "Channels: "
        + ", ".join(f"#{c.id} ({'private' if c.private else 'public'})" for c in conv.channels)
    )
    loaded = await demo.load(bot, conv)
    if loaded.new_messages == 0:
        say(f"Already loaded in {bot.settings.db_path} ({loaded.messages} messages).")
    else:
        say(
            f"Loaded {loaded.new_messages} messages, {loaded.edits} edit, {loaded.deletes} delete "
            f"and {loaded.roster} roster events through the dispatcher into {bot.settings.db_path}."
        )
    if loaded.errors:
        say(f"! {loaded.errors} events failed; see the log above")
    built = await demo.build_memory(bot, conv)
    embedder = getattr(bot.engine.embedder, "name", None) or "off (lexical search only)"
    say(f"Embeddings: {embedder}; {built.embedded} new vectors.")
    if built.writer is None:
        if built.replayed:
            say(
                f"Records: {built.replayed} written with the demo (no LLM), replayed through "
                "the Writer's checks: people, the group, and the launch date's changes."
            )
        say(NO_LLM_HINT)
    else:
        where = mask_url(bot.settings.llm_base_url or "")
        say(
            f"Writer: {built.writer} at {where} wrote {built.records} "
            f"records from {built.segments} segments ({dict(built.outcomes)})."
        )
    answers = await demo.ask(bot, conv)
    for i, (ex, result) in enumerate(answers, 1):
        say()
        say(f"--- example {i}: {conv.person(ex.asker).name} in #{ex.channel} asks")
        say(f"/recall {ex.question}")
        say(render_answer(result.answer, await _texts(bot, result)))
        say(explain_summary(result))
    return answers


async def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    settings = local_settings(settings)
    _quiet_logs(args)
    async with local_bot(settings, background=False) as bot:
        await run_demo(bot, sys.stdout)
        if args.no_input:
            print(
                "\n--no-input: the shell is not opened. Later: "
                f"speakermem shell --db {settings.db_path}"
            )
            return 0
        print("\nThe shell is next. Try: /as carol, /recall what did Dan propose?, /channel #leads")
        workspace = demo.load_conversation().workspace
        return await open_shell(
            bot, sys.stdin, sys.stdout, args.speaker, DEFAULT_CHANNEL, workspace
        )


async def open_shell(
    bot: LocalBot,
    stdin: TextIO,
    out: TextIO,
    speaker: str,
    channel: str,
    workspace: str,
    *,
    offer_demo: bool = False,
) -> int:
    """Run the shell until /quit or end of input; on an empty store, offer the demo first.

    Background work (the Writer scheduler, embedding) starts after the demo is loaded, so the
    demo's own Writer pass never runs beside the scheduler's.
    """
    lines = line_source(stdin, out)
    shell = ShellAdapter(
        bot.dispatcher,
        bot.engine,
        lines,
        out,
        workspace=workspace,
        speaker=speaker,
        channel=channel,
    )
    if offer_demo:
        counts = await bot.engine.admin.message_counts()
        if (
            counts["messages"] == 0
            and counts["deleted"] == 0
            and await shell.ask_yes_no(
                f"{bot.settings.db_path} is empty. Load the demo conversation (six people, two "
                "weeks, #general and the private #leads)?"
            )
        ):
            await run_demo(bot, out)
    bot.start_background()
    await shell.start()
    try:
        await shell.serve()
    finally:
        await shell.stop()
    return 0


async def cmd_shell(settings: Settings, args: argparse.Namespace) -> int:
    settings = local_settings(settings)
    _quiet_logs(args)
    # Offer the demo only to someone at a terminal: a piped script's first line is a command.
    offer = sys.stdin.isatty()
    async with local_bot(settings, background=False) as bot:
        return await open_shell(
            bot, sys.stdin, sys.stdout, args.speaker, args.channel, args.workspace, offer_demo=offer
        )

"""The rules every new way of asking shares (bot.asks): the question without the bot's
mention, the context menu's question, and the per-member limit, which the setting sets and
the slash command does not count against. Real store and pipeline (no LLM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from speakermem.bot.asks import CONTEXT_QUESTION, MAX_CONTEXT_CHARS, context_question, question_text
from speakermem.bot.events import CommandInvocation
from speakermem.bot.rate_limit import PerMinuteLimiter
from speakermem.bot.settings import Settings
from speakermem.integrations.runtime import build_dispatcher
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.models import Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.conftest import msg


def test_the_question_is_the_text_without_the_bots_mentions() -> None:
    assert question_text("<@U0BOT> what did we decide?", ["U0BOT"]) == "what did we decide?"
    assert question_text("hey <@U0BOT|mem>  and <@U1>?", ["U0BOT"]) == "hey and <@U1>?"
    assert question_text("<@!42> when? <@42>", ["42", ""]) == "when?"
    assert question_text("<@U0BOT>", ["U0BOT"]) == ""


def test_the_context_question_quotes_the_message_cut() -> None:
    assert context_question("") == CONTEXT_QUESTION
    long = context_question("word " * 400)
    assert long.startswith(CONTEXT_QUESTION)
    assert len(long) <= len(CONTEXT_QUESTION) + MAX_CONTEXT_CHARS + 4


def test_the_limiter_counts_per_key_in_a_sliding_minute() -> None:
    limiter = PerMinuteLimiter(2, max_keys=2)
    assert limiter.allow("a", now=0.0) and limiter.allow("a", now=1.0)
    assert not limiter.allow("a", now=59.0)
    assert limiter.allow("b", now=59.0)  # another key has its own budget
    assert limiter.allow("a", now=60.5)  # the first use left the window
    assert not limiter.would_allow("a", now=60.9)  # a look does not count a use
    assert limiter.would_allow("a", now=61.5) and limiter.would_allow("a", now=61.5)


def _ask(scope: Scope, via: str, text: str = "launch") -> CommandInvocation:
    return CommandInvocation(
        scope=scope,
        command="recall",
        user_id="ann",
        text=text,
        via=via,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("per_minute", [1, 2])
async def test_asks_are_limited_per_member_by_the_setting_and_slash_commands_are_not(
    engine: MemoryEngine, scope: Scope, tmp_path: Path, per_minute: int
) -> None:
    await engine.ingest(msg(scope, "m1", "Ann", "the launch is on Friday", 1))
    await engine.ingest(msg(scope, "m2", "Bo", "fine by me", 2))
    settings = Settings(db_path=tmp_path / "x.db", ask_per_minute=per_minute)
    dispatcher = build_dispatcher(settings, engine, RecallPipeline(engine))
    answers = [await dispatcher.recall(_ask(scope, via)) for via in ("mention", "reply", "context")]
    assert [a.refused for a in answers] == [False] * per_minute + [True] * (3 - per_minute)
    assert "wait" in answers[-1].text
    assert dispatcher.ask_refusal(_ask(scope, "dm")) is not None  # looked, not counted
    assert dispatcher.ask_refusal(_ask(scope, "command")) is None
    assert not (await dispatcher.recall(_ask(scope, "command"))).refused
    other = CommandInvocation(
        scope=scope, command="recall", user_id="bo", text="launch", via="mention"
    )
    assert not (await dispatcher.recall(other)).refused


async def test_a_mention_without_a_question_and_a_dm_with_nothing_readable_are_refused(
    engine: MemoryEngine, scope: Scope, tmp_path: Path
) -> None:
    await engine.ingest(msg(scope, "m1", "Ann", "the launch is on Friday", 1))
    dispatcher = build_dispatcher(
        Settings(db_path=tmp_path / "x.db"), engine, RecallPipeline(engine)
    )
    empty = await dispatcher.recall(_ask(scope, "mention", text="  "))
    assert empty.refused and "after the mention" in empty.text
    nothing = _ask(scope, "dm").model_copy(update={"readable_scopes": ()})
    answer = await dispatcher.recall(nothing)
    assert answer.refused and "no channel you can read" in answer.text
    # a direct question with its readable channels answers from them and names them
    readable = _ask(scope, "dm").model_copy(update={"readable_scopes": (scope,)})
    answer = await dispatcher.recall(readable)
    assert not answer.refused and answer.citations and answer.searched == [scope]


def test_a_reply_quotes_the_message_it_asks_about() -> None:
    from speakermem.bot.asks import reply_question

    assert reply_question("why?", "We ship on  Friday") == "why? (about: “We ship on Friday”)"
    assert reply_question("", "We ship on Friday").startswith(CONTEXT_QUESTION)
    assert reply_question("why?", "") == "why?"

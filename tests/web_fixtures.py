"""The web console's test store and server, shared by the route tests, the browser tests and
`tests/web_screenshots.py`.

The store is the demo conversation (shell/local: #general, the private #leads) loaded through
the dispatcher, with the Writer run against the LLM stand-in (one record per segment, so every
person has records with sources), plus a second workspace (shell/elsewhere: #random) for
"a member of another workspace". The roles sign in as:
- operator: the console's token;
- admin: Alice, admin of shell/local;
- member: Carol, in #general but not in #leads;
- other: Zed, a member of shell/elsewhere only;
- anonymous: nobody.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from speakermem.bot.events import MessageEvent, RosterAction, RosterEvent
from speakermem.bot.settings import Settings
from speakermem.integrations.shell import demo
from speakermem.integrations.shell.session import local_bot
from speakermem.integrations.web.access import Membership, Principal
from speakermem.integrations.web.server import WebConsole
from speakermem.integrations.web.sessions import SESSION_COOKIE, Session
from speakermem.memory.console import ConsoleReads
from speakermem.memory.engine import MemoryEngine
from speakermem.memory.governance.service import Governance
from speakermem.memory.models import DerivedRecord, Scope
from speakermem.memory.query.pipeline import RecallPipeline
from tests.llm_server import Handler, LLMServer, one_add_per_segment

OPERATOR_TOKEN = "operator-token-for-tests-0123456789"
LOCAL = ("shell", "local")
GENERAL = Scope(platform="shell", workspace="local", channel="general")
LEADS = Scope(platform="shell", workspace="local", channel="leads")
RANDOM = Scope(platform="shell", workspace="elsewhere", channel="random")

ROLES: dict[str, Principal | None] = {
    "operator": Principal(name="operator", operator=True),
    "admin": Principal(
        name="Alice",
        platform="shell",
        user_id="alice",
        memberships=(Membership("shell", "local", "alice", admin=True),),
    ),
    "member": Principal(
        name="Carol",
        platform="shell",
        user_id="carol",
        memberships=(Membership("shell", "local", "carol"),),
    ),
    "other": Principal(
        name="Zed",
        platform="shell",
        user_id="zed",
        memberships=(Membership("shell", "elsewhere", "zed"),),
    ),
    "anonymous": None,
}

OTHER_TEXTS = [
    ("zed", "Zed", "The elsewhere team ships the quarterly kiosk rollout on Friday."),
    ("yan", "Yan", "Zed, the kiosk rollout needs the new payment terminal firmware first."),
    ("zed", "Zed", "Yan, agreed: firmware 4.2 goes on the kiosks before Friday."),
]


def settings_for(db_path: Path, **extra: Any) -> Settings:
    values: dict[str, Any] = {
        "db_path": db_path,
        "embedder": "none",
        "web_admin_token": SecretStr(OPERATOR_TOKEN),
        "llm_base_url": None,
    }
    values.update(extra)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


async def build_store(db_path: Path) -> None:
    """Write the console's test store at `db_path` (about two seconds)."""
    async with LLMServer(default=Handler(one_add_per_segment)) as llm:
        settings = settings_for(db_path, llm_base_url=llm.base_url, llm_model="test-model")
        async with local_bot(settings, background=False) as bot:
            conv = demo.load_conversation()
            await demo.load(bot, conv)
            t0 = datetime(2025, 3, 20, 9, 0, tzinfo=UTC)
            for uid, name, _ in OTHER_TEXTS[:2]:
                await bot.dispatcher.handle(
                    RosterEvent(
                        scope=RANDOM, action=RosterAction.JOIN, user_id=uid, name=name, at=t0
                    )
                )
            for i, (uid, name, text) in enumerate(OTHER_TEXTS):
                await bot.dispatcher.handle(
                    MessageEvent(
                        scope=RANDOM,
                        message_id=f"r{i:03d}",
                        speaker_id=uid,
                        speaker_name=name,
                        text=text,
                        ts=t0 + timedelta(minutes=i + 1),
                    )
                )
            await bot.engine.store.channels.set_meta(RANDOM, name="random", is_private=False)
            await bot.engine.store.segments.close_channel(RANDOM)
            await demo.build_memory(bot, conv)
            await bot.engine.infer_interactions()


def build_store_once(db_path: Path) -> Path:
    """`build_store` in a thread of its own (a fresh event loop, whatever the caller runs)."""
    errors: list[BaseException] = []

    def work() -> None:
        try:
            asyncio.run(build_store(db_path))
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    thread = threading.Thread(target=work, name="console-store")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return db_path


def copy_store(src: Path, dst_dir: Path) -> Path:
    """A private copy of a closed SQLite store (the file and any WAL beside it)."""
    dst = dst_dir / src.name
    for suffix in ("", "-wal", "-shm"):
        path = src.with_name(src.name + suffix)
        if path.exists():
            shutil.copyfile(path, dst.with_name(dst.name + suffix))
    return dst


@pytest.fixture(scope="session")
def console_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store_once(tmp_path_factory.mktemp("console-store") / "console.db")


@dataclass
class RunningConsole:
    console: WebConsole
    engine: MemoryEngine

    @property
    def url(self) -> str:
        return self.console.url

    def session(self, role: str) -> Session | None:
        """A fresh signed-in session for a role (None: anonymous)."""
        principal = ROLES[role]
        if principal is None:
            return None
        return self.console.state.sessions.create(principal, provider=None)

    def cookie_header(self, session: Session | None) -> dict[str, str]:
        if session is None:
            return {}
        return {"Cookie": f"{SESSION_COOKIE}={self.console.state.sessions.cookie(session)}"}

    async def records_in(self, scope: Scope) -> list[DerivedRecord]:
        """The active records of a channel (for picking ids in tests)."""
        pks = await self.engine.channel_pks([scope])
        return await self.engine.store.records.heads(pks)


@asynccontextmanager
async def running_console(
    db_path: Path, *, recall: bool = True, **settings_extra: Any
) -> AsyncIterator[RunningConsole]:
    """The console over `db_path` on a free port, as `speakermem web` builds it (no LLM)."""
    settings = settings_for(db_path, **settings_extra)
    engine = await MemoryEngine.open(settings.memory_config(), None)
    try:
        console = WebConsole(
            settings,
            ConsoleReads(engine),
            Governance(engine),
            recaller=RecallPipeline(engine) if recall else None,
            port=0,
        )
        await console.start()
        try:
            yield RunningConsole(console=console, engine=engine)
        finally:
            await console.stop()
    finally:
        await engine.close()

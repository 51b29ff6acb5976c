"""Pytest fixture for the scripted LLM server; import it into a conftest or a test module:

from tests.llm_fixtures import llm_server  # noqa: F401
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.llm_server import LLMServer


@pytest_asyncio.fixture
async def llm_server() -> AsyncIterator[LLMServer]:
    """A fresh server per test: empty script, NOOP default, random port."""
    async with LLMServer() as server:
        yield server

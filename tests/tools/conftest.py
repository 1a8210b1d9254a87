"""The MCP tests' upstream: the search server of tests/support/fake_mcp.py, served for real."""

from __future__ import annotations

import pytest
import trio

from tests.support.fake_mcp import SearchState, start_search


@pytest.fixture
async def search(nursery: trio.Nursery) -> tuple[SearchState, str]:
    """The search server's state and its /mcp URL."""
    state = SearchState()
    return state, await start_search(nursery, state)

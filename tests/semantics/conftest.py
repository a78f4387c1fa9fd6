from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ovsproxy.ovs.sandbox import Sandbox
from tests.semantics.harness import World, make_world


@pytest.fixture
async def world(sandbox: Sandbox) -> AsyncIterator[World]:
    w = await make_world(sandbox)
    yield w
    await w.semantics.close()
    await w.channel.close()

"""`Engine.aclose()` ends the engine completely from the task that entered it, inside any task group
and any cancel scope, under asyncio and trio; leaving `async with` (or `__aexit__`) after it is a
no-op, and a caller waiting on a full pool gets EngineClosed at once."""

from __future__ import annotations

import time

import anyio
import pytest

from agentrt.config import EngineConfig
from agentrt.engine.engine import Engine
from agentrt.errors import EngineClosed
from tests.conftest import tiny_model_with_tokenizer

BACKENDS = ["asyncio", "trio"]


def _engine() -> Engine:
    return Engine(tiny_model_with_tokenizer(), EngineConfig(max_session_seqs=1, acquire_timeout=60))


async def _wait_for_id(eng: Engine, got: dict) -> None:
    t0 = time.monotonic()
    try:
        await eng.open_session(tag="waiter")
    except EngineClosed as e:
        got["error"], got["after_s"] = e, time.monotonic() - t0


@pytest.mark.parametrize("backend", BACKENDS)
def test_aclose_in_the_entering_task_inside_a_task_group(backend):
    """The issue's scenario: entered with `await Engine(...).__aenter__()` in a task group's body,
    an open_session waiting on the full pool, then aclose() from the same task: the waiter gets
    EngineClosed within 5 s and the task group exits cleanly (it raised "Attempted to exit a
    cancel scope that isn't the current task's current cancel scope" when the engine's portal
    was left open)."""
    got: dict = {}

    async def main():
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                eng = await _engine().__aenter__()
                held = await eng.open_session(tag="holder")  # the pool's one session id
                tg.start_soon(_wait_for_id, eng, got)
                await anyio.sleep(0.2)  # (the waiter is waiting on the pool)
                await eng.aclose()
                assert eng.closed
                await held.close()  # (a no-op on a closed engine)
        await eng.__aexit__(None, None, None)  # after aclose(): nothing left to do, no error

    anyio.run(main, backend=backend)
    assert isinstance(got.get("error"), EngineClosed) and got["after_s"] < 5, got


@pytest.mark.parametrize("backend", BACKENDS)
def test_aclose_inside_a_nested_cancel_scope_then_leaving_async_with(backend):
    """aclose() inside cancel scopes opened after the engine (the surface fuzzer's case), then the
    `async with` ends: both are clean, and a second aclose() is a no-op."""
    async def main():
        async with _engine() as eng:
            with anyio.CancelScope():
                with anyio.move_on_after(30):
                    await eng.aclose()
            await eng.aclose()
            with pytest.raises(EngineClosed):
                await eng.open_session()

    anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_aclose_from_another_task(backend):
    """A task other than the one that entered the engine closes it; the entering task's
    `async with` then leaves cleanly."""
    async def main():
        async with _engine() as eng:
            async with anyio.create_task_group() as tg:
                tg.start_soon(eng.aclose)
            assert eng.closed

    anyio.run(main, backend=backend)

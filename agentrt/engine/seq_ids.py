"""The sequence pool: a fixed set of sequence ids split into a transient region (one-shot
requests) and a session region (long-lived agents). It bounds how many sequences exist at once.

    ids: [0 ........ n_transient) [n_transient ........ n_transient + n_session)
          transient region         session region
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal

import anyio

from agentrt.errors import ConfigError, PoolExhausted

Kind = Literal["transient", "session"]


class SequencePool:
    def __init__(self, n_transient: int, n_session: int):
        if n_transient < 1 or n_session < 0:
            raise ConfigError("sequence pool needs n_transient >= 1 and n_session >= 0")
        self._free: dict[str, deque[int]] = {
            "transient": deque(range(n_transient)),
            "session": deque(range(n_transient, n_transient + n_session)),
        }
        self._size = {"transient": n_transient, "session": n_session}
        self._cond = threading.Condition()
        self._closed: Callable[[], BaseException] | None = None  # makes the error waiters get
        self._wake: set = set()  # async waiters (_Waiter), woken on close
        # async waiters' tickets per kind, oldest first: only the first takes a free id (FIFO)
        self._line: dict[str, deque] = {"transient": deque(), "session": deque()}

    def close(self, error: Callable[[], BaseException]) -> None:
        """The engine is closing (or died): every waiter, now and later, raises error() at
        once instead of waiting for its timeout. release() still works."""
        with self._cond:
            self._closed = error
            wake, self._wake = list(self._wake), set()
            self._cond.notify_all()
        for waiter in wake:
            waiter()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed()

    def _check_kind(self, kind: str) -> None:
        if kind not in self._free:
            raise ConfigError(f"sequence kind {kind!r} is unknown; use 'transient' or 'session'")

    def try_acquire(self, kind: Kind) -> int | None:
        """A free id now, or None (also while async waiters are in line for one: no overtaking)."""
        self._check_kind(kind)
        with self._cond:
            free = self._free[kind]
            return free.popleft() if free and not self._line[kind] else None

    def _take_in_turn(self, kind: str, ticket: object) -> int | None:
        with self._cond:
            free, line = self._free[kind], self._line[kind]
            return free.popleft() if free and line[0] is ticket else None

    def acquire(self, kind: Kind, timeout: float | None = None) -> int:
        """Block (this thread) until an id of `kind` is free; PoolExhausted after `timeout` s."""
        self._check_kind(kind)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._free[kind]:
                self._check_open()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise self._exhausted(kind, timeout)
                self._cond.wait(left)
            return self._free[kind].popleft()

    async def acquire_async(self, kind: Kind, timeout: float | None = None) -> int:
        """Like acquire() without blocking the event loop. Waiters are served in arrival order
        (one line per kind: only the first takes a free id, so a burst of later callers never
        starves an earlier one). Cancellation-safe: an id is only taken atomically, by the
        first in line, so a cancelled wait holds nothing. close() wakes it at once with the
        engine's error. Call it on the event loop that owns the engine."""
        self._check_kind(kind)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.002
        me = _Waiter()
        with self._cond:
            self._line[kind].append(me)
        try:
            while True:
                self._check_open()
                if (sid := self._take_in_turn(kind, me)) is not None:
                    return sid
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise self._exhausted(kind, timeout)
                with self._cond:
                    if self._closed is None:
                        self._wake.add(me)
                wait = delay if deadline is None else min(delay, max(0.0, deadline - now))
                with anyio.move_on_after(wait):
                    await me.wait()
                delay = min(delay * 2, 0.05)
        finally:
            with self._cond:
                self._wake.discard(me)
                line = self._line[kind]
                line.remove(me)
                nxt = line[0] if line and self._free[kind] else None
            if nxt is not None:
                nxt()  # (the next in line may take the id left free, without its poll's delay)

    def release(self, seq_id: int) -> None:
        kind = "transient" if seq_id < self._size["transient"] else "session"
        with self._cond:
            if seq_id in self._free[kind]:
                raise RuntimeError(f"sequence id {seq_id} released twice")
            self._free[kind].append(seq_id)
            self._cond.notify()

    @contextlib.contextmanager
    def lease(self, kind: Kind, timeout: float | None = None):
        sid = self.acquire(kind, timeout)
        try:
            yield sid
        finally:
            self.release(sid)

    def num_free(self, kind: Kind) -> int:
        with self._cond:
            return len(self._free[kind])

    def check_invariants(self, in_use: set[int]) -> None:
        """Every id is free xor taken, and the engine's ids are taken. Ids taken but not (yet)
        known to the engine are fine: a caller acquires on the event loop, then submits."""
        with self._cond:
            free = list(self._free["transient"]) + list(self._free["session"])
        total = self._size["transient"] + self._size["session"]
        if len(set(free)) != len(free) or not set(free) <= set(range(total)):
            raise AssertionError(f"pool: the free list is corrupt: {sorted(free)}")
        if set(free) & in_use:
            raise AssertionError(f"pool: ids both free and in use: {sorted(set(free) & in_use)}")

    def _exhausted(self, kind: str, timeout) -> PoolExhausted:
        return PoolExhausted(
            f"no {kind} sequence slot free after {timeout}s ({self._size[kind]} in the pool); "
            f"close idle sessions, raise EngineConfig.max_{kind}_seqs, or wait longer")


class _Waiter:
    """One async waiter: calling it wakes its current wait (a fresh event per wait, so a wake
    that came between two waits does not make every later wait return at once)."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def __call__(self) -> None:
        self.event.set()

    async def wait(self) -> None:
        if self.event.is_set():
            self.event = anyio.Event()
            return
        await self.event.wait()

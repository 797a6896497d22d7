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
        self._wake: set = set()  # anyio events of async waiters, set on close

    def close(self, error: Callable[[], BaseException]) -> None:
        """The engine is closing (or died): every waiter, now and later, raises error() at
        once instead of waiting for its timeout. release() still works."""
        with self._cond:
            self._closed = error
            wake, self._wake = list(self._wake), set()
            self._cond.notify_all()
        for set_event in wake:
            set_event()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed()

    def _check_kind(self, kind: str) -> None:
        if kind not in self._free:
            raise ConfigError(f"sequence kind {kind!r} is unknown; use 'transient' or 'session'")

    def try_acquire(self, kind: Kind) -> int | None:
        self._check_kind(kind)
        with self._cond:
            free = self._free[kind]
            return free.popleft() if free else None

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
        """Like acquire() without blocking the event loop. Cancellation-safe: an id is only
        taken by the atomic try_acquire, so a cancelled wait holds nothing. close() wakes it at
        once with the engine's error. Call it on the event loop that owns the engine."""
        self._check_kind(kind)
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.002
        woken = anyio.Event()
        token = woken.set
        try:
            while True:
                self._check_open()
                if (sid := self.try_acquire(kind)) is not None:
                    return sid
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise self._exhausted(kind, timeout)
                with self._cond:
                    if self._closed is None:
                        self._wake.add(token)
                wait = delay if deadline is None else min(delay, max(0.0, deadline - now))
                with anyio.move_on_after(wait):
                    await woken.wait()
                delay = min(delay * 2, 0.05)
        finally:
            with self._cond:
                self._wake.discard(token)

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

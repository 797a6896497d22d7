"""The disk KV tier: the level below the host tier, and what survives a restart.

A *record* holds the KV of a run of tokens [start, start + n) computed after a given prefix. It
is content-addressed: the prefix is named by its *key*, a BLAKE2b over the KV's identity -- the
model's fingerprint, the tenant salt, the adapter's content fingerprint and start
(kv/identity.py) -- and every token id of the prefix; the record's id hashes its parent key and
its own tokens. So a key does not depend on where earlier records were cut, the same run after
the same prefix is written once whoever computed it, and a tenant or an adapter never reaches
another's records. The index (state/sql.py's `kv_records`) is a radix tree by parent key:
a lookup walks it from the identity's root, each step taking the child whose tokens run
longest along the prompt (a record may be used in part: a prefix shared by many sessions is
written once, and a session diverging inside it writes only its own run after the point).

* Reads (`fetch`) run in a worker thread before a request reaches the step loop
  (engine/engine.py); the step thread only copies the records' tensors into fresh pages at
  admission (`adopt`, kv/room.py users), never touches a file. A record that fails its
  checksum or its header (state/records.py) is deleted and its tokens recomputed: never used.
* Writes (`turn_ended`) keep references on a finished turn's pages; a writer thread gathers
  the new tokens' KV from the pool, writes the record (fsync, rename, directory fsync), then
  indexes it and updates the session's registry row; the step thread drops the references
  (`reap`) at its next step.
* Bounded by `EngineConfig.disk_budget_bytes`: past it, records go in the engine's eviction
  policy's order (least recently used first by default); a record left without its parent is
  unreachable and ages out the same way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch

from agentrt.kv.identity import Adapted
from agentrt.kv.kv_io import gather_kv
from agentrt.prefixes import common_prefix
from agentrt.state.records import CorruptRecord, forget_records, read_record, record_path, tmp_files, write_record
from agentrt.state.sql import KVRow, SessionRow, SQLStore

log = structlog.get_logger("agentrt.kv.disk")


@dataclass
class DiskHit:
    """The KV of a prompt's first `len(tokens)` tokens, read from disk ([layers, n, Hkv, D])."""

    tokens: list[int]
    k: torch.Tensor
    v: torch.Tensor
    records: tuple[str, ...]


@dataclass
class _Write:
    space: str
    tokens: list[int]
    pages: list[int]  # the pages of tokens [first * page_size, len(tokens)), referenced
    first: int  # the page index the held pages start at
    done: Callable[[int], None]  # f(n): the sequence's first n tokens are on disk (the session's disk_until)
    tag: str | None
    key: str | None  # the session's registry key (None: not registered)
    tenant: str | None
    adapter: str | None


class DiskKV:
    """The disk tier of one engine: lookups and reads (any thread), writes (its writer thread)."""

    def __init__(self, root: str | Path, store: SQLStore, model_key: str, store_kv, budget_bytes: int, policy=None):
        self.root, self.store, self.model_key = Path(root), store, model_key
        self.kv_store, self.budget, self.policy = store_kv, int(budget_bytes), policy
        k0 = store_kv.k[0]
        self.layers, self.heads, self.dim, self.dtype = len(store_kv.k), k0.shape[2], k0.shape[3], k0.dtype
        self.policy_lock = threading.Lock()  # the engine sets its step lock here
        self.held: dict[int, list[int]] = {}  # write job id -> pages it keeps referenced
        self._done: queue.SimpleQueue = queue.SimpleQueue()  # job ids whose pages may go
        self._jobs: queue.Queue = queue.Queue()  # job ids, in order
        self._queued: dict[int, _Write] = {}  # job id -> its write, until the writer takes it
        self._owner: dict[int, int] = {}  # a sequence (id) -> its queued job's id
        self._lock = threading.Lock()  # (between the step thread's replace and the writer's take)
        # a sequence (id) -> retry(force) of its write deferred for room
        self._dirty: dict[int, Callable[[bool], None]] = {}
        self._ids = iter(range(1, 1 << 62))
        self.counters = {"records_written": 0, "bytes_written": 0, "records_read": 0, "tokens_restored": 0,
                         "corrupt_records": 0, "records_evicted": 0, "write_errors": 0, "writes_deferred": 0}
        # pages writes in flight may keep referenced (admission cannot take them: memory is for
        # running requests first)
        self.max_held = max(1, store_kv.num_pages // 8)
        (self.root / "kv").mkdir(parents=True, exist_ok=True)
        self._sweep()
        self._thread = threading.Thread(target=self._writer, name="agentrt-disk-kv", daemon=True)
        self._thread.start()

    # ---- keys -------------------------------------------------------------------------
    def space_key(self, salt: str | None, adapted: Adapted) -> str:
        """The root key of KV of this identity (kv/identity.py) on this model."""
        ident = json.dumps([self.model_key, salt, adapted.fingerprint, adapted.start])
        return hashlib.blake2b(ident.encode(), digest_size=16).hexdigest()

    @staticmethod
    def hasher(space: str):
        """A BLAKE2b over the identity `space`: fed a prefix's token ids (int32 bytes), its
        hexdigest is that prefix's key."""
        return hashlib.blake2b(space.encode(), digest_size=16)

    # ---- lookup and read ------------------------------------------------------------
    def lookup(self, space: str, tokens: list[int], limit: int | None = None) -> list[tuple[KVRow, int]]:
        """The records whose tokens run along `tokens` from 0 (each with how many of its tokens
        are used), at most `limit` tokens in all."""
        arr = array("i", tokens)
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        h, pos, path = self.hasher(space), 0, []
        while pos < limit:
            best, take = None, 0
            for row in self.store.kv_children(h.hexdigest()):
                run = array("i")
                run.frombytes(row.tokens)
                m = common_prefix(run, arr[pos:min(limit, pos + row.n)])
                if m > take:
                    best, take = row, m
            if best is None:
                break
            path.append((best, take))
            h.update(arr[pos:pos + take].tobytes())
            pos += take
        return path

    def fetch(self, space: str, tokens: list[int], resident: int, min_gain: int) -> DiskHit | None:
        """The KV of `tokens`' longest prefix on disk, read and checked, when it holds at least
        `min_gain` tokens more than the `resident` ones (None otherwise). A worker thread's call."""
        path = self.lookup(space, tokens, len(tokens) - 1)
        if sum(t for _, t in path) < resident + min_gain:
            return None
        ks, vs, used, n = [], [], [], 0
        for row, take in path:
            shape = (self.layers, row.n, self.heads, self.dim)
            try:
                k, v = read_record(record_path(self.root, row.id), row.id, shape, self.dtype)
            except CorruptRecord as e:
                self.counters["corrupt_records"] += 1
                log.warning("disk KV record failed its check: recomputed instead", record=row.id, why=str(e))
                forget_records(self.store, self.root, [row.id])
                break
            ks.append(k[:, :take])
            vs.append(v[:, :take])
            used.append(row.id)
            n += take
        if n < resident + min_gain:
            return None
        self.store.kv_touch(used)
        self.counters["records_read"] += len(used)
        self.counters["tokens_restored"] += n
        k, v = (ks[0], vs[0]) if len(ks) == 1 else (torch.cat(ks, 1), torch.cat(vs, 1))
        return DiskHit(list(tokens[:n]), k, v, tuple(used))

    # ---- writes ----------------------------------------------------------------------
    def turn_ended(self, alloc, seq, space: str, on_disk: int, done: Callable[[int], None],
                   retry: Callable[[bool], None] | None = None, force: bool = False, **info) -> bool:
        """A turn ended: write what of its sequence's KV past `on_disk` tokens the disk lacks
        (in the writer thread; those pages stay referenced until then; `done(n)` after). A queued
        write of the same sequence not started yet is replaced (this one covers it). When the
        writes in flight already hold `max_held` pages (memory is for running requests), not
        now (`force`: whatever they hold): `retry(force)` runs when a write finishes (it writes
        what the sequence holds then), or at once, forced, when its session closes. A
        step-thread call."""
        n, ps = len(seq.tokens), self.kv_store.page_size
        first = min(on_disk, n) // ps
        pages = list(seq.pages[first:-(-n // ps)])
        if n == 0 or not pages:
            return False
        job = _Write(space, list(seq.tokens), pages, first, done, **info)
        with self._lock:
            jid = self._owner.get(id(seq))
            if jid is not None:  # (its last turn's write has not started: this one replaces it)
                alloc.incref(pages)
                alloc.decref(self.held[jid])
                self.held[jid], self._queued[jid] = pages, job
                return True
            if not force and self.held and sum(map(len, self.held.values())) + len(pages) > self.max_held:
                self.counters["writes_deferred"] += 1
                if retry is not None:
                    self._dirty[id(seq)] = retry
                return False
            alloc.incref(pages)
            jid = next(self._ids)
            self.held[jid], self._queued[jid], self._owner[id(seq)] = pages, job, jid
        self._jobs.put(jid)
        return True

    def reap(self, alloc, force: bool = False) -> None:
        """Drop the references of finished writes, then retry the writes deferred for room
        (`force`: all of them, room aside). A step-thread call."""
        freed = False
        while True:
            try:
                jid = self._done.get_nowait()
            except queue.Empty:
                break
            alloc.decref(self.held.pop(jid))
            freed = True
        if (freed or force) and self._dirty:
            dirty, self._dirty = self._dirty, {}
            for retry in dirty.values():
                retry(force)

    def closing(self, seq) -> None:
        """The session of `seq` closes: its write deferred for room (if any) goes now."""
        retry = self._dirty.pop(id(seq), None)
        if retry is not None:
            retry(True)

    def held_pages(self) -> list[list[int]]:
        return list(self.held.values())

    def flush(self, timeout: float = 60.0) -> bool:
        """Wait until every queued write is done (True) or `timeout` passed (False)."""
        deadline = time.monotonic() + timeout
        while self._jobs.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._jobs.unfinished_tasks

    def close(self, alloc=None) -> None:
        """Finish every write, the deferred ones too, and stop the writer."""
        self.flush()
        if alloc is not None:
            self.reap(alloc, force=True)
            self.flush()
        self._jobs.put(None)
        self._thread.join(timeout=10.0)
        if alloc is not None:
            self.reap(alloc)

    def _writer(self) -> None:
        _background()
        while True:
            jid = self._jobs.get()
            if jid is None:
                self._jobs.task_done()
                return
            with self._lock:
                job = self._queued.pop(jid)
                self._owner = {k: j for k, j in self._owner.items() if j != jid}
            try:
                self._write(job)
            except Exception as e:  # a full disk or a lost database costs the record, never the turn
                self.counters["write_errors"] += 1
                log.warning("disk KV write failed; the turn's KV stays in memory only", error=repr(e))
            finally:
                self._done.put(jid)
                self._jobs.task_done()

    def _write(self, job: _Write) -> None:
        tokens, n = job.tokens, len(job.tokens)
        path = self.lookup(job.space, tokens)
        have = sum(t for _, t in path)
        records = [row.id for row, _ in path]
        if have < n:
            arr = array("i", tokens)
            h = self.hasher(job.space)
            h.update(arr[:have].tobytes())
            parent, run = h.hexdigest(), arr[have:].tobytes()
            rid = hashlib.blake2b(parent.encode() + b":" + run, digest_size=16).hexdigest()
            off = job.first * self.kv_store.page_size
            if have < off:  # (records it continued were evicted meanwhile: the next turn writes from there)
                self.counters["writes_deferred"] += 1
                job.done(have)
                return
            k, v = gather_kv(self.kv_store, job.pages, have - off, n - off)
            target = record_path(self.root, rid)
            target.parent.mkdir(exist_ok=True)
            nbytes = write_record(target, rid, k, v)
            if self.store.kv_put(KVRow(rid, parent, have, n - have, run, nbytes, job.tag, time.time())):
                self.counters["records_written"] += 1
                self.counters["bytes_written"] += nbytes
            records.append(rid)
            self._evict(keep={rid})
        elif records:
            self.store.kv_touch(records)
        job.done(n)
        if job.key is not None:
            h = self.hasher(job.space)
            h.update(array("i", tokens).tobytes())
            self.store.put_session(SessionRow(job.key, job.tenant, self.model_key, job.adapter, h.hexdigest(), n,
                                              tuple(records), time.time()))

    def _evict(self, keep: set[str]) -> None:
        """Past the budget: delete records in the policy's order (LRU without one)."""
        if self.store.kv_bytes() <= self.budget:
            return
        rows = [r for r in self.store.kv_all() if r.id not in keep]
        if self.policy is None:
            order = sorted(rows, key=lambda r: r.last_use)
        else:
            with self.policy_lock:  # (the policy is the step thread's: ranked between two steps)
                order = self.policy.victim_order(rows)
        over, gone = self.store.kv_bytes() - self.budget, []
        for r in order:
            if over <= 0:
                break
            gone.append(r.id)
            over -= r.nbytes
        self.counters["records_evicted"] += forget_records(self.store, self.root, gone)

    def _sweep(self) -> None:
        """At open: temporary files a crash left (never indexed) go."""
        for d in (self.root / "kv").iterdir():
            if d.is_dir():
                for p in tmp_files(d):
                    with contextlib.suppress(OSError):
                        p.unlink()

    def check_invariants(self) -> None:
        """Within the budget (and one record written past it); every queued write holds its
        pages, and a sequence has at most that one queued write."""
        rows = self.store.kv_all()
        if sum(r.nbytes for r in rows) > self.budget + max((r.nbytes for r in rows), default=0):
            raise AssertionError("the disk tier holds more than its budget and one record")
        with self._lock:
            if not set(self._queued) <= set(self.held) or not set(self._owner.values()) <= set(self._queued):
                raise AssertionError("a queued disk write holds no pages, or a sequence owns a write not queued")


def _background() -> None:
    """Lower the calling thread's CPU priority to the least (Linux: per thread): the writes take
    the cores only when the step loop leaves them idle, and never preempt its OpenMP team
    (every thread of a parallel region waits for the slowest: a write preempting one would
    stretch the whole step)."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)

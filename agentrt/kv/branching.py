"""Session branching inside the engine: fork, rollback, export and import of a session's KV.

Every method of `Branching` runs in the engine's step thread (through `Engine.run_in_step_thread`), between two
steps, so it sees the core at rest: no request is half-way through a forward. Each is all or
nothing: on any failure it gives back what it took, and the caller's undo gives back the pool id.

  * fork: the child's page table points at the parent's pages (refcounts only, O(pages)); the
    first write into a shared page copies it (KVManager.prepare_write), so parent and child
    diverge without ever seeing each other's tokens.
  * rollback: drops the KV of the last n tokens (pages past them are released).
  * export / import: the KV per token, gathered from / scattered into the paged store, so a
    snapshot does not depend on the page size or page ids of either engine.

A session with a turn running (es.busy) is refused with SessionBusy: its KV is changing.
"""

from __future__ import annotations

import torch

from agentrt.errors import ConfigError, OutOfKVMemory, SessionBusy, SnapshotMismatch
from agentrt.kv.hierarchy import Hierarchy
from agentrt.kv.identity import Adapted
from agentrt.kv.kv_io import gather_kv, scatter_kv
from agentrt.kv.room import KVRoom
from agentrt.kv.sessions import EngineSession


class Branching:
    """Fork, rollback, export and import over one engine's KV space."""

    def __init__(self, kv: KVRoom, hierarchy: Hierarchy):
        self.kv, self.hierarchy = kv, hierarchy

    def check_idle(self, es: EngineSession, what: str) -> None:
        """es is open, belongs to this core and has no turn running (typed errors otherwise)."""
        if es.closed:
            raise ConfigError(f"cannot {what} a closed session; open (or restore) a new one")
        if self.kv.sessions.get(es.sid) is not es:
            raise ConfigError(f"cannot {what} a session of another engine; use the engine that opened it")
        if es.busy:
            raise SessionBusy(f"cannot {what} the session while a turn is running on it; wait for the turn "
                              "to finish (read its stream to the end or await complete()), then retry")

    def fork(self, es: EngineSession, sid: int, tag: str | None = None) -> EngineSession:
        """A new session (pool id `sid`) holding es's KV by aliasing every page es holds."""
        self.check_idle(es, "fork")
        self._restore_tail(es)
        n = min(len(es.seq.tokens), len(es.seq.pages) * self.kv.kvm.ps)  # (pages always cover the tokens)
        child = self.kv.open_session(sid, es.tag if tag is None else tag, es.cache_salt)
        try:
            self.kv.kvm.alias(child.seq, es.seq.tokens[:n], es.seq.pages)
        except BaseException:
            self.kv.forget_session(child)
            raise
        child.last_used, child.seq.adapted, child.adapter = es.last_used, es.seq.adapted, es.adapter
        self._set_history(child)
        return child

    def rollback(self, es: EngineSession, n_tokens: int) -> None:
        """Forget the KV of the session's last n_tokens tokens (0 <= n_tokens <= what it holds)."""
        self.check_idle(es, "roll back")
        held = len(es.seq.tokens)
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or not 0 <= n_tokens <= held:
            raise ConfigError(f"n_tokens must be an int in [0, {held}] (the session holds {held} tokens), "
                              f"got {n_tokens!r}")
        self.kv.kvm.truncate(es.seq, held - n_tokens)
        self._set_history(es)  # (restore_tail must not bring the dropped tokens back)

    def export(self, es: EngineSession) -> dict:
        """{tokens, k, v, tag}: the session's token ids and their KV as CPU tensors
        [layers, n_tokens, Hkv, D] (copies: the store goes on changing after this returns)."""
        self.check_idle(es, "snapshot")
        self._restore_tail(es)
        n = len(es.seq.tokens)
        store = self.kv.kvm.store
        pages = es.seq.pages[:self.kv.kvm.pages_for(n)]
        k, v = gather_kv(store, pages, 0, n)
        data = {"tokens": list(es.seq.tokens), "k": k, "v": v, "tag": es.tag}
        if not es.seq.adapted.base:  # (KV of a LoRA: restored only where that adapter is loaded)
            data["adapter"] = {"name": es.adapter or "", "fingerprint": es.seq.adapted.fingerprint,
                               "start": es.seq.adapted.start}
        local = self.kv.alloc.local
        if local is not None:  # (which tokens' sliding-window KV was released: kv/window.py)
            gone = torch.tensor([not local.present(p) for p in pages], dtype=torch.bool)
            data["local_absent"] = gone.repeat_interleave(store.page_size)[:n]
        return data

    def restore(self, sid: int, data: dict, tag: str | None, cache_salt: str | None) -> EngineSession:
        """A new session (pool id `sid`) holding data's tokens and KV (read_snapshot checked both
        against the model). Pages come from free memory, then evictable cache and idle sessions."""
        tokens, n = list(data["tokens"]), len(data["tokens"])
        absent = data.get("local_absent")
        if absent is not None and bool(absent.any()) and self.kv.alloc.local is None:
            raise SnapshotMismatch(
                "this snapshot's sliding-window layers had released the KV of positions their windows had "
                "passed; this engine keeps one KV pool and could not tell them apart: restore it on an engine "
                "whose sliding-window layers keep their own pool (EngineConfig.window_kv_tokens, or a "
                "kv_cache_tokens larger than its windows need), or start a fresh session")
        need = self.kv.kvm.pages_for(n)
        if not self.kv.mem.reclaim(need):
            raise OutOfKVMemory(
                f"restoring a session of {n} tokens needs {need} free KV pages; only {self.kv.alloc.num_free} of "
                f"{self.kv.alloc.num_pages} could be freed (running requests and busy sessions hold the rest): "
                "wait for running turns to finish, close idle sessions, or raise EngineConfig.kv_cache_tokens")
        pages = self.kv.alloc.alloc(need)
        try:
            scatter_kv(self.kv.kvm.store, pages, data["k"], data["v"])
            self._release_absent(pages, data.get("local_absent"))
            es = self.kv.open_session(sid, tag, cache_salt)
        except BaseException:
            self.kv.alloc.decref(pages)
            raise
        es.seq.pages, es.seq.tokens = pages, tokens
        if (adapter := data.get("adapter")) is not None:
            es.seq.adapted = Adapted(adapter["fingerprint"], adapter["start"])
            es.adapter = adapter["name"] or None
        self._set_history(es)
        return es

    def _release_absent(self, pages: list[int], absent) -> None:
        """A snapshot whose sliding-window KV was partly released comes back the same: those
        pages release theirs again (the snapshot holds zeros there; no window reads them)."""
        local = self.kv.alloc.local
        if absent is None or local is None or not bool(absent.any()):
            return
        ps = self.kv.kvm.ps
        for i, p in enumerate(pages):
            if bool(absent[i * ps:(i + 1) * ps].any()):
                local.detach(p)

    def _restore_tail(self, es: EngineSession) -> None:
        """A tail the session gave up under memory pressure comes back first (when the engine's
        memory manager can do that), so a fork or snapshot holds the session's whole history."""
        if self.kv.radix is not None:
            self.hierarchy.restore_tail(es)

    def _set_history(self, es: EngineSession) -> None:
        """After a fork, rollback or import, what the session holds is its history: the one the
        memory hierarchy restores it to (EngineSession.history), and in the radix tree like every
        finished turn's KV, so memory pressure can rank its pages with the rest (kv/memory.py)."""
        es.history = list(es.seq.tokens)
        self.kv.insert_prefix(es.seq.tokens, es.seq.pages, es.cache_salt, es.tag, es.seq.adapted)

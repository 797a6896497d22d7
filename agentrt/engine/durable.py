"""The engine's durable state (issue 59): its state store and disk KV tier, opened from
`EngineConfig.state_dir` / `state_url`, what a finished session turn leaves on disk, and what a
request brings back from it before it is queued.

* Open (`open_durable`): the store (state/sql.py), and with a state dir the disk tier
  (kv/disk.py) keyed by the model's fingerprint (kv/snapshot.py), so another model's records
  are never matched. A model whose sliding-window layers keep their own pool gets no disk tier
  (its released window KV cannot be told apart on disk); the store still serves.
* A session's turn ends (`turn_ended`, step thread): its sequence's KV goes to the writer
  thread, under its identity (kv/identity.py: tenant salt, adapter) and its registry key.
* A request is submitted (`restore_for`, event loop): the longest prefix of its prompt the disk
  holds beyond what the pool holds is read in a worker thread; the step thread adopts it at
  admission (kv/hierarchy.py::Hierarchy.adopt). A failing disk costs the restore, never the turn.
"""

from __future__ import annotations

import hashlib
import json

import anyio
import structlog

from agentrt.kv.disk import DiskHit, DiskKV
from agentrt.kv.identity import BASE, Adapted, space
from agentrt.model.fingerprint import model_fingerprint
from agentrt.prefixes import common_prefix
from agentrt.state.backends import open_store
from agentrt.state.sql import SQLStore

log = structlog.get_logger("agentrt.engine")


def open_durable(cfg, model, kv, simulated: bool) -> tuple[SQLStore | None, DiskKV | None]:
    """(the state store, the disk KV tier); None where the settings (or a simulation) ask none."""
    if simulated or not (cfg.state_dir or cfg.state_url):
        return None, None
    store = open_store(cfg.state_dir, cfg.state_url)
    if not cfg.state_dir or store is None:  # (a state dir always opens a store)
        return store, None
    if kv.alloc.local is not None:
        log.info("disk KV tier off: this model's sliding-window layers keep their own pool", state_dir=cfg.state_dir)
        return store, None
    return store, DiskKV(cfg.state_dir, store, model_key(model), kv.kvm.store, cfg.disk_budget_bytes, kv.policy)


def model_key(model) -> str:
    """The model's fingerprint (architecture, dtypes, weight digest) as one short hex string."""
    fp = json.dumps(model_fingerprint(model), sort_keys=True, default=str)
    return hashlib.sha256(fp.encode()).hexdigest()[:32]


def turn_ended(core, r, force: bool = False) -> None:
    """A session's turn ended (any reason but an error): its KV goes to disk, off the loop
    (deferred while writes hold too many pages: retried when one finishes, unless the session
    closed meanwhile)."""
    disk, es = core.disk, r.session
    if disk is None or es is None or not r.seq.tokens or (es.closed and not force):
        return
    adapted = r.seq.adapted

    def done(n: int) -> None:  # (the writer thread: a plain int, read by the step thread)
        es.disk_until = n
    disk.turn_ended(core.alloc, r.seq, disk.space_key(r.cache_salt, adapted), es.disk_until, done,
                    lambda force: turn_ended(core, r, force), force, tag=r.tag, key=es.key, tenant=r.cache_salt,
                    adapter=adapted.fingerprint)


async def restore_for(core, prompt: list[int], es, cache_salt: str | None, adapter: str | None) -> DiskHit | None:
    """The KV of `prompt`'s longest prefix on disk, when it beats what the pool holds by a page
    at least (read in a worker thread); None otherwise, or on any failure of the disk tier."""
    disk = core.disk
    if disk is None or len(prompt) <= core.cfg.page_size:
        return None
    try:
        name = adapter if adapter is not None or es is None else es.adapter
        lora, start = core.adapters.resolve(name, prompt)
        adapted = BASE if lora is None else Adapted(lora.fingerprint, start)
        salt = cache_salt if es is None else es.cache_salt
        resident = _resident(core, prompt, es, salt, adapted)
        if es is not None and es.history and resident >= len(es.history):
            return None  # (the session holds all it ever wrote: the disk has nothing more for it)
        return await anyio.to_thread.run_sync(disk.fetch, disk.space_key(salt, adapted), prompt, resident,
                                              core.cfg.page_size)
    except Exception as e:  # (an unknown adapter fails in add_request, with its own message)
        log.warning("disk KV restore skipped", error=repr(e))
        return None


def _resident(core, prompt: list[int], es, salt, adapted: Adapted) -> int:
    """Tokens of `prompt` the pool holds now, read from the event loop (an estimate: the step
    thread may change it meanwhile; admission checks again before adopting anything)."""
    held = common_prefix(es.seq.tokens, prompt) if es is not None and es.seq.adapted == adapted else 0
    if core.radix is not None:
        try:
            held = max(held, core.radix.peek(prompt, space(salt, adapted)))
        except Exception:  # (the tree changed under the read)
            pass
    return held

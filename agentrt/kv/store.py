"""The paged KV store: per-layer K and V tensors allocated once. Which page belongs to which
sequence is the cache manager's business (kv_manager.py); the model only reads page tables.
The store knows of a model only its KV shape (`KVShape`: ModelConfig is one).

Sliding-window layers may keep their pages apart (kv/window.py): `local_of` maps a logical page
to its row in those layers' tensors (-1: released), and they hold `num_local` rows. The map is
kept twice: on the store's device, where the tier and snapshots index it with device tensors,
and on the host, where the allocator's bookkeeping and the batch builder read it without a
device sync; every write goes to both (`PageMap.set`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from agentrt.errors import ConfigError
from agentrt.kernels.reference import kv_groups


class KVShape(Protocol):
    """What a store's layout depends on (model/config.py::ModelConfig has it: read-only here)."""

    @property
    def num_layers(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...

    def window(self, layer: int) -> int: ...  # the layer's sliding window (0: full attention)


KV_MODES = {torch.float32: 0, torch.float16: 1, torch.int8: 2}  # the kernels' kv_mode


def kv_mode(dtype: torch.dtype) -> int:
    """The compiled kernels' code for a KV store's element type (ConfigError for others)."""
    if dtype not in KV_MODES:
        raise ConfigError(f"the CPU kernels read a float32, float16 or int8 KV store, got {dtype}")
    return KV_MODES[dtype]


def head_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of one head's row in the store: int8 rows carry a float32 scale per 32 values."""
    return head_dim + 4 * kv_groups(head_dim) if dtype == torch.int8 else head_dim


class PageMap:
    """Logical page -> row of the sliding-window layers' own tensors (-1: none), on the host
    (`host`: reads without a device sync) and on the store's device (`device_map`: indexed by
    device tensors). Written only through `set`, which keeps the two equal."""

    def __init__(self, num_pages: int, device: torch.device):
        self.host = torch.full((num_pages,), -1, dtype=torch.int64)  # [num_pages], on the host
        self._np = self.host.numpy()  # (the same memory: scalar reads at numpy's cost)
        # [num_pages] on the store's device (the host copy itself for a CPU store)
        self.device_map = self.host if device.type == "cpu" else self.host.to(device)

    def __len__(self) -> int:
        return self.host.shape[0]

    def __getitem__(self, page: int) -> int:
        return int(self._np[page])

    def set(self, pages: list[int], rows: list[int]) -> None:
        """local_of[pages[i]] = rows[i], on the host and on the device (one copy there)."""
        self._np[pages] = rows
        if self.device_map is not self.host:
            dev = self.device_map.device
            self.device_map[torch.tensor(pages, dtype=torch.int64, device=dev)] = \
                torch.tensor(rows, dtype=torch.int64, device=dev)

    def rows(self, pages: torch.Tensor) -> torch.Tensor:
        """The local rows of `pages` (on the store's device), -1 where released."""
        return self.device_map[pages]

    def check(self) -> None:
        """The device copy equals the host copy (a debug check: it syncs; `meta` holds no data)."""
        if self.device_map.device.type != "meta" and not torch.equal(self.device_map.cpu(), self.host):
            raise AssertionError("the device copy of the local page map differs from its host copy")


@dataclass(frozen=True)
class KVStore:
    """k[layer], v[layer]: [num_pages, page_size, Hkv, D] ([num_local, ...] on the local layers
    of a store with `local_of`). An int8 store's rows are D + 4 * ceil(D / 32) bytes: each
    (token, head)'s values quantized to int8 with a scale per 32 of them, amax / 127, kept after
    them as float32 bytes (kernels/reference.quantize_kv), so pages copy, demote and snapshot
    as whole rows."""

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    page_size: int
    local_layers: tuple[bool, ...] = ()  # per layer: its pages are local ones (with local_of)
    local_of: PageMap | None = None  # [num_pages]: logical page -> local row, -1 none
    window: int = 0  # the local layers' largest window (with local_of)

    @property
    def device(self) -> torch.device:
        """Where every tensor of the store (and local_of's device copy) lives."""
        return self.k[0].device

    @property
    def host_device(self) -> torch.device:
        """Where copies of the store's KV taken out of it live (tier entries, snapshots): host
        memory; a store on `meta` (no data: the tests' stand-in for a GPU) keeps them there."""
        return self.device if self.device.type == "meta" else torch.device("cpu")

    @property
    def num_pages(self) -> int:
        return self.k[0].shape[0] if self.local_of is None else len(self.local_of)

    @property
    def local_host(self) -> torch.Tensor | None:
        """local_of's host copy [num_pages] (the batch builder's), None without local pages."""
        return None if self.local_of is None else self.local_of.host

    def is_local(self, layer: int) -> bool:
        return self.local_of is not None and self.local_layers[layer]

    def row(self, layer: int, page: int) -> int:
        """The row of `layer`'s tensors holding logical page `page` (0 for a released one:
        never read, since no window reaches it). Reads the host copy: no device sync."""
        if self.local_of is None or not self.local_layers[layer]:
            return page
        return max(0, self.local_of[page])

    def rows(self, layer: int, pages: torch.Tensor) -> torch.Tensor:
        """row() of each of `pages` [n] (on the store's device), on the store's device."""
        if self.local_of is None or not self.local_layers[layer]:
            return pages
        return self.local_of.rows(pages).clamp(min=0)

    @classmethod
    def allocate(cls, cfg: KVShape, num_pages: int, page_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 num_local: int | None = None) -> "KVStore":
        """`num_local`: rows of the sliding-window layers' own pool (None: those layers index
        the logical pages like the others)."""
        if num_pages < 1 or page_size < 1:
            raise ConfigError(f"KV store needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}")
        local = tuple(cfg.window(i) > 0 for i in range(cfg.num_layers)) if num_local is not None else ()
        if num_local is not None and (num_local < 1 or not any(local)):
            raise ConfigError(f"a local KV pool needs num_local >= 1 and sliding-window layers, got {num_local}")

        def one(layer: int) -> torch.Tensor:
            rows = num_local if num_local is not None and local[layer] else num_pages
            width = head_width(cfg.head_dim, dtype)
            return torch.zeros((rows, page_size, cfg.num_kv_heads, width), dtype=dtype, device=device)
        k = tuple(one(i) for i in range(cfg.num_layers))
        v = tuple(one(i) for i in range(cfg.num_layers))
        local_of = PageMap(num_pages, torch.device(device)) if local else None
        window = max((cfg.window(i) for i in range(cfg.num_layers)), default=0) if local else 0
        return cls(k, v, page_size, local, local_of, window)

    @staticmethod
    def bytes_per_token(cfg: KVShape, dtype: torch.dtype = torch.float32, local: bool | None = None) -> int:
        """KV bytes per token of every layer (local=True: of the sliding-window layers only;
        False: of the others)."""
        elem = torch.empty((), dtype=dtype).element_size()
        n = sum(1 for i in range(cfg.num_layers) if local is None or (cfg.window(i) > 0) == local)
        return 2 * n * cfg.num_kv_heads * head_width(cfg.head_dim, dtype) * elem

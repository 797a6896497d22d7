"""The paged KV store: per-layer K and V tensors allocated once. Which page belongs to which
sequence is the cache manager's business (agentrt.kv); the model only reads page tables."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrt.errors import ConfigError
from agentrt.model.config import ModelConfig


@dataclass(frozen=True)
class KVStore:
    """k[layer], v[layer]: [num_pages, page_size, Hkv, D]."""

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    page_size: int

    @property
    def num_pages(self) -> int:
        return self.k[0].shape[0]

    @classmethod
    def allocate(cls, cfg: ModelConfig, num_pages: int, page_size: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "KVStore":
        if num_pages < 1 or page_size < 1:
            raise ConfigError(f"KV store needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}")
        shape = (num_pages, page_size, cfg.num_kv_heads, cfg.head_dim)
        k = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers))
        v = tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers))
        return cls(k, v, page_size)

    @staticmethod
    def bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elem

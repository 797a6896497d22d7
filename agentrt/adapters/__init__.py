"""LoRA adapters per agent: read (PEFT directories), keyed by content, applied per row segment in
one batch with the base model (docs/adapters.md)."""

from agentrt.adapters.apply import LoraStep
from agentrt.adapters.lora import LoraAdapter, LoraPart, build_adapter
from agentrt.adapters.peft_files import read_peft

__all__ = ["LoraAdapter", "LoraPart", "LoraStep", "build_adapter", "read_peft"]

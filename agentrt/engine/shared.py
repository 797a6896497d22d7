"""What the layers above build once per engine and share (`Engine.shared`): the chat format and
the grammar factory (conversation/engine_text.py) and the turn log (conversation/timeline.py).
Named slots, each None until first use; an engine that is not local (integrations/ray's
RemoteEngine) fills the first two when it is made. The engine never reads them: their types
belong to the layers above, so the slots are typed by what those layers put there."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EngineShared:
    chat_format: Any = None  # conversation/chat_format.py::ChatFormat
    grammars: Any = None  # constrain/grammar.py::GrammarFactory (or a replica's RemoteGrammars)
    timeline: Any = None  # conversation/timeline.py::TurnLog

"""Streaming (sans-I/O) tool-call parsing and validation.

    parser = ToolCallParser(tools, wrapper="auto")
    for piece in decoded_text_pieces:
        for event in parser.feed(piece):
            ...  # TextDelta / CallStarted / ArgumentsDelta / CallComplete / CallInvalid / EarlyStop
        if parser.should_stop:
            break
    events = parser.close()
"""

from agentrt.toolcall.parse_events import (
    ArgumentsDelta,
    CallComplete,
    CallInvalid,
    CallStarted,
    EarlyStop,
    Event,
    InvalidKind,
    ParserState,
    TextDelta,
    Verdict,
)
from agentrt.toolcall.parser import WRAPPERS, ToolCallParser
from agentrt.toolcall.scanner import JsonScanner
from agentrt.toolcall.specs import ToolSpec, load_tool_specs
from agentrt.toolcall.tags import CLOSE_TAG, OPEN_TAG

__all__ = [
    "ArgumentsDelta", "CallComplete", "CallInvalid", "CallStarted", "EarlyStop", "Event",
    "InvalidKind", "ParserState", "TextDelta", "Verdict", "ToolCallParser", "OPEN_TAG",
    "CLOSE_TAG", "WRAPPERS", "JsonScanner", "ToolSpec", "load_tool_specs",
]

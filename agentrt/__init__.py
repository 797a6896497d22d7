"""agentrt: an in-process async actor runtime for multi-agent LLM tool calling.

Public API; everything else is internal and may change.
"""

from agentrt import errors
from agentrt.cache.agent_aware import AgentAwarePolicy
from agentrt.cache.base import EvictionPolicy, LRUPolicy
from agentrt.config import EngineConfig
from agentrt.engine.engine import Completion, Engine
from agentrt.engine.request import TokenEvent, Usage
from agentrt.engine.session import Session
from agentrt.engine.stats import EngineStats
from agentrt.model.config import ModelConfig
from agentrt.model.generate import generate
from agentrt.model.llama import LlamaModel
from agentrt.model.loader import DEFAULT_MODEL, LoadedModel, load_model
from agentrt.runtime.actor import ActorRef
from agentrt.runtime.agent import Agent, GenerationSettings
from agentrt.runtime.events import TurnResult
from agentrt.runtime.runtime import Runtime
from agentrt.runtime.supervision import Supervision
from agentrt.sampling import SamplingParams
from agentrt.session.chat import ChatFormat
from agentrt.session.conversation import Conversation, RoundEnd
from agentrt.toolcall.formats import ToolFormat, detect_tool_format
from agentrt.toolcall import ToolCallParser
from agentrt.tools import Tool, ToolContext, ToolResult, Toolset, tool

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "ActorRef",
    "Agent",
    "GenerationSettings",
    "Runtime",
    "Supervision",
    "Tool",
    "ToolCallParser",
    "ToolContext",
    "ToolResult",
    "Toolset",
    "TurnResult",
    "tool",
    "AgentAwarePolicy",
    "Completion",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "EvictionPolicy",
    "LRUPolicy",
    "LlamaModel",
    "LoadedModel",
    "ModelConfig",
    "SamplingParams",
    "ChatFormat",
    "Conversation",
    "RoundEnd",
    "ToolFormat",
    "detect_tool_format",
    "Session",
    "TokenEvent",
    "Usage",
    "errors",
    "generate",
    "load_model",
]

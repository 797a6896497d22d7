"""LangChain's standard integration tests whose pass depends on the model's answers (the
`model_quality` ones of test_langchain_standard.py: a joke as JSON, structured output, a call's
arguments, the agent loop), run as the suite ships them on scripted replies
(tests/scripted_model.py), in both modes: an in-process engine, and a remote `agentrt serve`.

The replies are what a good model would write for the suite's prompts; everything between the
prompt and the parsed result is agentrt's (chat format, grammar of the schema or of the tool
choice, parser, streaming, LangChain messages, the server's protocol), so these tests gate.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from agentrt import Engine, EngineConfig
from agentrt.integrations.langgraph.host import EngineHost
from agentrt.toolcall.formats import HERMES
from tests.integrations import test_langchain_standard as standard
from tests.scripted_model import last_user, scripted

pytestmark = [pytest.mark.embedded, pytest.mark.slow, pytest.mark.anyio]  # (the embedded GGUF's tokenizer)

ONLY = standard.MODEL_QUALITY  # (conftest.py: the suite's other tests run on the embedded model only)
_Flags = standard._Flags

SETUP = "Why did the cat sit on the computer?"
JOKE = {"setup": SETUP, "punchline": "To keep an eye on the mouse."}
CALLS = {  # the suite's tool-calling prompts -> (tool, arguments)
    "What is the weather in San Francisco, CA?": ("get_weather", {"location": "San Francisco, CA"}),
    "What is the value of magic_function(3)? Use the tool.": ("magic_function", {"input": 3}),
    "Using the tool, generate a Pirate greeting.": ("greeting_generator", {"answer_style": "pirate"}),
    "Create a customer named '你好啊集团' (Hello Group) - a Chinese technology company":
        ("unicode_customer", {"customer_name": "你好啊集团", "description": "a Chinese technology company"}),
    "Create a customer named 'こんにちは株式会社' (Hello Corporation) - a Japanese company":
        ("unicode_customer", {"customer_name": "こんにちは株式会社", "description": "a Japanese company"}),
}


def reply(prompt: str) -> str | None:
    """What a good model answers to the suite's prompts (None: the turn ends at once)."""
    asked = last_user(prompt)
    if asked.startswith("<tool_response>"):  # (SmolLM2's template: a tool result is a user turn)
        return "It's sunny in San Francisco, CA."
    if asked in CALLS:
        name, args = CALLS[asked]
        return HERMES.render_calls([(name, args)])
    if "joke" in asked:
        return json.dumps({"setup": SETUP} if "no punchline" in asked else JOKE, ensure_ascii=False)
    return None


@pytest.fixture(scope="module")
def scripted_lm():
    return scripted(reply)


@pytest.fixture(scope="class", autouse=True)
def _engine_host(request, scripted_lm):
    host = EngineHost.start(lambda: Engine(scripted_lm, EngineConfig(kv_cache_tokens=16384)))
    request.cls.host = host
    yield host
    host.close()


@pytest.fixture(scope="class")
def _remote_server(request, scripted_lm):
    from agentrt.server import ServerConfig, ServerThread

    with ServerThread(scripted_lm, ServerConfig(port=0, model_name="smollm2-135m"), EngineConfig(kv_cache_tokens=16384)) as server:
        request.cls.url = server.url
        yield server


class TestScriptedChatAgentrtIntegration(_Flags, ChatModelIntegrationTests):
    """The suite's answer-dependent tests on an in-process engine over scripted replies."""


@pytest.mark.usefixtures("_remote_server")
class TestScriptedRemoteChatAgentrtIntegration(_Flags, ChatModelIntegrationTests):
    """The same through a loopback `agentrt serve`."""

    url: str

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"base_url": self.url, "model_name": "smollm2-135m"}

"""LangChain's standard chat-model suites (`langchain-tests`) on ChatAgentrt over the embedded model,
in both modes: an in-process engine, and a remote `agentrt serve` (`base_url=`) on the same model.

The feature flags say what ChatAgentrt implements: tool calling with tool_choice, structured
output (json_schema, json_mode, function_calling), usage with cache reads; no image, audio or
PDF inputs, no per-call model override (one engine serves one model). The tests whose pass
depends on what the 135M model answers (a joke with both keys, a call's arguments, calling a
tool unasked) are marked `model_quality` by name (MODEL_QUALITY, applied in conftest.py: the
suite's tests are not overridden); test_langchain_standard_scripted.py runs those same tests on
scripted replies, where only the API decides.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from agentrt import Engine, EngineConfig
from agentrt.integrations.langgraph import ChatAgentrt
from agentrt.integrations.langgraph.host import EngineHost

pytestmark = [pytest.mark.embedded, pytest.mark.slow, pytest.mark.anyio]

# Parametrized standard tests that fail for one parameter only are marked by id (conftest.py), since
# the suite refuses overrides of its tests that are not xfail as a whole.
PARAM_XFAILS: dict = {}
# the standard tests that pass only if the model answers well (every parametrization): a JSON
# object with both keys (json_mode), the joke's strings short enough to close (structured
# output), the call's arguments (magic_function(3), an answer_style, Unicode names) and calling
# get_weather unasked (agent loop: the 135M model answers in prose)
MODEL_QUALITY = {
    "test_json_mode", "test_structured_output", "test_structured_output_async",
    "test_structured_output_pydantic_2_v1", "test_structured_output_optional_param", "test_tool_calling",
    "test_tool_calling_async", "test_bind_runnables_as_tools", "test_unicode_tool_call_integration",
    "test_agent_loop",
}


@pytest.fixture(scope="class", autouse=True)
def _engine_host(request, embedded_native):
    """One engine per suite on its own loop; every model the suite builds shares it."""
    host = EngineHost.start(lambda: Engine(embedded_native, EngineConfig(kv_cache_tokens=16384)))
    request.cls.host = host
    yield host
    host.close()


class _Flags:
    host: EngineHost

    @property
    def chat_model_class(self) -> type[ChatAgentrt]:
        return ChatAgentrt

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"host": self.host, "model_name": "smollm2-135m"}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_anthropic_inputs(self) -> bool:
        return True  # text blocks with cache_control, tool_use blocks, thinking blocks

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    @property
    def supports_model_override(self) -> bool:
        return False


@pytest.fixture(scope="class")
def _remote_server(request, embedded_native):
    """A loopback `agentrt serve` on the embedded model for the remote suites."""
    from agentrt.server import ServerConfig, ServerThread

    with ServerThread(embedded_native, ServerConfig(port=0, model_name="smollm2-135m"), EngineConfig(kv_cache_tokens=16384)) as server:
        request.cls.url = server.url
        yield server


class _Remote(_Flags):
    url: str

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"base_url": self.url, "model_name": "smollm2-135m"}


class TestChatAgentrtUnit(_Flags, ChatModelUnitTests):
    """The unit suite with its standard parameters unchanged (`api_key="test"` included)."""

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        return {"AGENTRT_API_KEY": "key-from-env"}, {"host": self.host}, {"api_key": "key-from-env"}


class _CacheRead:
    """The cache-read usage the suite asks for, through either mode."""

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """Two calls of one thread: the second reads the first's history from KV."""
        model = ChatAgentrt(**self.chat_model_params, max_tokens=8)
        config = {"configurable": {"thread_id": f"cache-read-{stream}"}}
        first = [HumanMessage("Say hello.")]
        reply = model.invoke(first, config)
        history = [*first, reply, HumanMessage("Say it again.")]
        if not stream:
            return model.invoke(history, config)
        full = None
        for chunk in model.stream(history, config):
            full = chunk if full is None else full + chunk
        return full


@pytest.mark.usefixtures("_remote_server")
class TestRemoteChatAgentrtUnit(_Remote, ChatModelUnitTests):
    """The unit suite on a remote ChatAgentrt, standard parameters unchanged."""

    @property
    def init_from_env_params(self) -> tuple[dict, dict, dict]:
        return {"AGENTRT_API_KEY": "key-from-env"}, {"base_url": self.url}, {"api_key": "key-from-env"}


@pytest.mark.usefixtures("_remote_server")
class TestRemoteChatAgentrtIntegration(_CacheRead, _Remote, ChatModelIntegrationTests):
    """The integration suite against `agentrt serve` over loopback."""


class TestChatAgentrtIntegration(_CacheRead, _Flags, ChatModelIntegrationTests):
    """The integration suite on an in-process engine."""

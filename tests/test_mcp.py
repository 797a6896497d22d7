"""MCP tools (agentrt/tools/mcp.py) against MCP servers built here with the official SDK's
FastMCP, over stdio and streamable HTTP: the tools keep their schemas, calls reach the server and
come back as results, and a tool error, a raising tool and a dead server are tool errors the
model can read. (Agents on the embedded model calling MCP tools: tests/test_examples.py.)"""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from agentrt.errors import ConfigError
from agentrt.tools import run_tool_call
from agentrt.tools.mcp import MCPTools
from tests.conftest import free_port as _free_port

SERVER = '''
import sys
from mcp.server.fastmcp import FastMCP

server = FastMCP("probe", host="127.0.0.1", port=int(sys.argv[2]) if len(sys.argv) > 2 else 0, log_level="WARNING")


@server.tool()
def get_weather(city: str, unit: str = "C") -> str:
    """Current weather in a city."""
    return f"{city}: 18 {unit}, cloudy"


@server.tool()
def broken(reason: str) -> str:
    """Always fails."""
    raise ValueError(f"broken: {reason}")


@server.tool(name="odd.name")
def odd() -> str:
    """A name with a dot."""
    return "odd"


if __name__ == "__main__":
    server.run(transport=sys.argv[1] if len(sys.argv) > 1 else "stdio")
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("mcp") / "server.py"
    path.write_text(SERVER)
    return str(path)


def test_stdio_tools_keep_their_schemas_and_calls_reach_the_server(script):
    async def main():
        async with MCPTools(command=sys.executable, args=[script]) as mcp:
            tools = {t.name: t for t in mcp.tools}
            assert set(tools) == {"get_weather", "broken", "odd_name"}  # a name tool APIs refuse is made safe
            schema = tools["get_weather"].parameters
            assert schema["required"] == ["city"] and set(schema["properties"]) == {"city", "unit"}
            ok = await run_tool_call(tools["get_weather"], '{"city": "Paris"}', call_id="c1")
            bad_args = await run_tool_call(tools["get_weather"], '{"town": "Paris"}', call_id="c2")
            raised = await run_tool_call(tools["broken"], '{"reason": "disk full"}', call_id="c3")
            odd = await run_tool_call(tools["odd_name"], "{}", call_id="c4")
        return ok, bad_args, raised, odd

    ok, bad_args, raised, odd = anyio.run(main)
    assert not ok.is_error and ok.content == "Paris: 18 C, cloudy"
    assert bad_args.is_error and "city" in bad_args.content  # validated here against the schema first
    assert raised.is_error and "disk full" in raised.content
    assert not odd.is_error and odd.content == "odd"


def test_streamable_http_and_a_server_that_dies_mid_session(script):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, script, "streamable-http", str(port)], stderr=subprocess.DEVNULL)

    async def main():
        with anyio.fail_after(30):
            while True:
                try:
                    async with MCPTools(url=f"http://127.0.0.1:{port}/mcp", include=["get_weather"]) as mcp:
                        tool = mcp.tools[0]
                        ok = await run_tool_call(tool, '{"city": "Oslo", "unit": "F"}', call_id="c1")
                        proc.kill()
                        proc.wait()
                        with anyio.fail_after(20):  # a tool error at once, not the call's timeout
                            dead = await run_tool_call(tool, '{"city": "Oslo"}', call_id="c2")
                        later = await run_tool_call(tool, '{"city": "Oslo"}', call_id="c3")
                        return [t.name for t in mcp.tools], ok, dead, later
                except ConfigError:  # the server is still starting
                    await anyio.sleep(0.2)

    try:
        names, ok, dead, later = anyio.run(main)
    finally:
        proc.kill()
    assert names == ["get_weather"] and ok.content == "Oslo: 18 F, cloudy"
    assert dead.is_error and "MCP server" in dead.content
    assert later.is_error and "not connected" in later.content


def test_bad_arguments_and_unreachable_servers_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="command= .* or url="):
        MCPTools()
    with pytest.raises(ConfigError, match="timeout"):
        MCPTools(url="http://127.0.0.1:1/mcp", timeout=0)

    async def main():
        with pytest.raises(ConfigError, match="cannot connect"):
            async with MCPTools(url=f"http://127.0.0.1:{_free_port()}/mcp", timeout=5):
                pass
        missing = tmp_path / "missing.py"
        with pytest.raises(ConfigError, match="cannot connect"):
            async with MCPTools(command=sys.executable, args=[str(missing)], timeout=10):
                pass

    anyio.run(main)

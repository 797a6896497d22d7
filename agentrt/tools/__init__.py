"""Tools: typed Python functions the model can call, and the dispatcher that runs the calls.

    @tool
    async def weather(city: str, unit: Literal["C", "F"] = "C") -> dict:
        '''Current weather for a city.

        Args:
            city: city name, e.g. "Lisbon"
        '''

    tools = Toolset([weather])
    schemas = tools.openai_schemas()             # for the chat template / ToolCallParser
    results = await tools.run_calls([("weather", '{"city": "Lisbon"}', "call_1")])
    messages = [r.to_message() for r in results]
"""

from agentrt.tools.dispatch import Call, Toolset, run_tool_call, run_tool_calls, unknown_tool_result
from agentrt.tools.docstrings import parse_docstring
from agentrt.tools.results import ToolResult, format_result, truncate
from agentrt.tools.tool import Tool, ToolContext, tool

__all__ = [
    "Call", "Tool", "ToolContext", "ToolResult", "Toolset", "format_result", "parse_docstring",
    "run_tool_call", "run_tool_calls", "tool", "truncate", "unknown_tool_result",
]

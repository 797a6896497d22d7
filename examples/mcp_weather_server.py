"""A small MCP server (the official SDK's FastMCP) with two tools, for examples/mcp_tools.py and
examples/langgraph_mcp.py, which start it themselves.

    python examples/mcp_weather_server.py                          # stdio (what the examples use)
    python examples/mcp_weather_server.py streamable-http 8765     # http://127.0.0.1:8765/mcp
"""

from __future__ import annotations

import sys

from mcp.server.fastmcp import FastMCP

WEATHER = {"paris": (18, "cloudy"), "tokyo": (24, "sunny"), "oslo": (-3, "snowing")}
TIMES = {"paris": "14:05", "tokyo": "21:05", "oslo": "14:05"}

server = FastMCP("weather", host="127.0.0.1", port=int(sys.argv[2]) if len(sys.argv) > 2 else 8765,
                 log_level="WARNING")


@server.tool()
def weather(city: str) -> str:
    """Current weather for a city."""
    found = WEATHER.get(city.strip().lower())
    return f"In {city} it is {found[0]} °C and {found[1]}." if found else f"No weather data for {city}."


@server.tool()
def local_time(city: str) -> str:
    """Local time in a city (24h clock)."""
    clock = TIMES.get(city.strip().lower())
    return f"It is {clock} in {city}." if clock else f"No time zone data for {city}."


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="A small MCP server with two tools (weather, local_time).")
    ap.add_argument("transport", nargs="?", default="stdio", choices=("stdio", "sse", "streamable-http"),
                    help="how clients reach it (default: stdio, as MCPTools(command=...) starts it)")
    ap.add_argument("port", nargs="?", type=int, default=8765, help="the HTTP transports' port (default 8765)")
    server.run(transport=ap.parse_args().transport)

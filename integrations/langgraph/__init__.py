"""agentrt.integrations.langgraph: LangGraph / LangChain adapters (needs `agentrt[langgraph]`)."""

__all__: list[str] = []

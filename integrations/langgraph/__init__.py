"""agentrt.integrations.langgraph: LangGraph / LangChain adapters (needs `agentrt[langgraph]`).

- `ChatAgentrt`: a LangChain chat model on an agentrt engine; each LangGraph thread + node keeps
  a KV session, so only the new messages of a resent history are prefilled.
- `SessionPolicy`: when those sessions are released.
- `agent_node` / `agent_task`: a graph node / Functional-API task backed by an agentrt `Agent`
  actor per thread (its own model -> tool loop and session); `handoff_tool` for `Command` handoffs.
- `workflow_of(graph)`: a compiled graph's DAG of nodes as an `agentrt.Workflow`;
  `declare_graph(engine, graph)` declares it and returns the graph configured to name it. Each
  graph run is one task (see workflow.py): model calls in its nodes carry it and their stage.
"""

from .chat_model import ChatAgentrt
from .nodes import agent_node, agent_task, handoff_tool
from .sessions import SessionPolicy, session_key
from .workflow import declare_graph, workflow_of

__all__ = ["ChatAgentrt", "SessionPolicy", "agent_node", "agent_task", "declare_graph", "handoff_tool",
           "session_key", "workflow_of"]

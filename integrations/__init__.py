"""agentrt.integrations: adapters to agent frameworks (installed under the agentrt package)."""

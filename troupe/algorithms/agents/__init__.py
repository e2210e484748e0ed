"""Multi-turn agent episodes over rollout-engine actors (LangGraph graphs) and their training batches."""

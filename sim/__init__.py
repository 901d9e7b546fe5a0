"""Simulator: agent-session traces, workload generation and replay on a simulated node."""

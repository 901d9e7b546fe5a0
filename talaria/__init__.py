"""Talaria: session-aware serving of tool-using agents on shared GPU nodes."""

__version__ = "0.1.0"

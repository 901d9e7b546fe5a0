"""Shared, dependency-light parts: model catalog, server spec, clock, types on the wire."""

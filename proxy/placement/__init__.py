"""Placement's live side in the proxy: the leader replica's loop (loop.py) reads the runtimes'
demand and status, decides with the pure controller (core/placement/) and places, drains and
removes models (moves.py) through the runtimes' API (target.py), from the operator's model library
(library.py), with its settings beside it (settings.py). May import contract and runtimes."""

"""Where each model is now: the placement that routing reads and the controller changes.

Per node, a model is in one of three states:

- *serving*: a call of it may be routed there;
- *receiving*: its weights are on the way (ready at a known time); counted as a replica by the
  controller, not routed to yet;
- *draining*: it takes no new session while another node serves the model (a moved model's
  new node may still be receiving it); a session whose last call ran there keeps it until it
  ends or ``drain_s`` after the drain began (then the session moves, its next call
  recomputing its KV elsewhere), and the model is removed once none is left.

The replay's dispatcher (sim/cluster.py) and a live proxy read ``candidates``; the placement
driver applies the controller's moves (``receive``, ``ready``, ``drain``, ``remove``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from talaria.core.placement.controller import NodeView


class PlacementTable:
    """Each node's serving, receiving and draining models (module docstring)."""

    def __init__(self, layout: Mapping[str, Iterable[str]], drain_s: float = float("inf")) -> None:
        self.drain_s = drain_s
        self.nodes = list(layout)
        self.serving: dict[str, set[str]] = {n: set(models) for n, models in layout.items()}
        self.receiving: dict[str, dict[str, float]] = {n: {} for n in layout}
        """Node → model → when its weights are ready."""
        self.draining: dict[str, dict[str, float]] = {n: {} for n in layout}
        """Node → model → when its drain began."""
        self.placed_s: dict[str, dict[str, float]] = {n: {} for n in layout}

    def candidates(self, model: str, last_node: str | None, now_s: float) -> list[str]:
        """The nodes a call of ``model`` may go to: those serving it, and the session's last
        node while it drains the model and ``drain_s`` has not passed; if none serves it,
        every node draining it within ``drain_s``."""
        found = [n for n in self.nodes if model in self.serving[n]]
        graced = [
            n
            for n in self.nodes
            if model in self.draining[n] and now_s - self.draining[n][model] < self.drain_s
        ]
        if not found:
            return graced
        if last_node in graced:
            found.append(last_node)
        return found

    def hosts(self, model: str) -> list[str]:
        """Nodes serving or receiving ``model``."""
        return [n for n in self.nodes if model in self.serving[n] or model in self.receiving[n]]

    def receive(self, node: str, model: str, ready_s: float, now_s: float) -> None:
        """``model``'s weights start for ``node``, ready at ``ready_s``."""
        self.receiving[node][model] = ready_s
        self.placed_s[node][model] = now_s

    def ready(self, node: str, model: str) -> None:
        """``model`` arrived on ``node`` and serves there."""
        self.receiving[node].pop(model, None)
        self.serving[node].add(model)

    def drain(self, node: str, model: str, now_s: float) -> None:
        """``node`` stops taking new sessions of ``model`` (module docstring)."""
        self.serving[node].discard(model)
        self.receiving[node].pop(model, None)
        self.draining[node][model] = now_s

    def expire(self, node: str, model: str) -> None:
        """End the drain's grace at once: no session is routed to ``model`` on ``node`` now
        (the model stays listed as draining until ``remove``)."""
        if model in self.draining[node]:
            self.draining[node][model] = float("-inf")

    def remove(self, node: str, model: str) -> None:
        """``model`` is gone from ``node``."""
        self.serving[node].discard(model)
        self.receiving[node].pop(model, None)
        self.draining[node].pop(model, None)
        self.placed_s[node].pop(model, None)

    def drain_expired(self, node: str, model: str, now_s: float) -> bool:
        """The drain of ``model`` on ``node`` began ``drain_s`` ago or more."""
        since = self.draining[node].get(model)
        return since is not None and now_s - since >= self.drain_s

    def views(
        self,
        live: Mapping[tuple[str, str], int],
        budget_bytes: Mapping[str, float],
        too_small: Mapping[str, frozenset[str]],
    ) -> Sequence[NodeView]:
        """The controller's view of every node; ``live``: (node, model) → live sessions;
        ``budget_bytes`` and ``too_small``: each node's (its GPU group's share of the host
        memory, the models its group cannot hold; absent: no bound)."""
        views = []
        for node in self.nodes:
            hosted = frozenset(self.serving[node] | set(self.receiving[node]))
            node_live = {m: c for (n, m), c in live.items() if n == node}
            views.append(
                NodeView(
                    node,
                    hosted,
                    frozenset(self.draining[node]),
                    budget_bytes.get(node, float("inf")),
                    dict(self.placed_s[node]),
                    node_live,
                    too_small.get(node, frozenset()),
                )
            )
        return views

    def layout(self) -> dict[str, tuple[str, ...]]:
        """Node → the models it serves now, sorted."""
        return {n: tuple(sorted(self.serving[n])) for n in self.nodes}

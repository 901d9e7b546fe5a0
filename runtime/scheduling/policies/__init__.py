"""The node scheduler's policies, as objects chosen once per node (issue 47).

Kinds, each a module: the queue order (queue.py: arrival, fair), the slot planner (planner.py:
round robin, demand, either with co-residency), the hold policy (holding.py: none, mean gap,
learned gap), and what a switch keeps and whether session-prefill admits (switching.py). Every
object hears the node's session events (runtime/scheduling/events.py: a call admitted, a call
ended, a session forgotten), so what a policy keeps per session is forgotten with the session.
compose.py maps the named policies (flags.py: ``round``, ``talaria``, ``±flag``) to one choice
per kind and builds the objects; nothing else reads a flag. This package's modules are imported
by path (``policies.compose``, ``policies.queue``…); the events live beside the scheduler
(events.py), which the service accounts (fairness.py) hear too: the folder imports the
scheduler's files, never the other way round but from the node's assembly (node.py, intake.py,
loop.py).
"""

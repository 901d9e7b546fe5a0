"""The call path, one step per module, top to bottom: the door (door.py: authenticate with
auth.py, read and bound the body with bounds.py, identify the session, place it at the edge,
open the call; its stages carry the call's context, call.py), then the gateway (gateway.py:
admit with schemas.py, place, resolve, route, run with runner.py, record with recorder.py; its
stages carry the call's context in the gateway, stages.py), the session keeper around the
calls (keeper.py: route preferences, hints, ends), and the end of it all (shutdown.py).
context.py is what every route reaches: the proxy's services. May import contract, store,
sessions, runtimes, cluster and placement."""

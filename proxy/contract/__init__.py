"""What the proxy's rooms agree on, and nothing else: the settings it is built from
(settings.py), the call as the call path carries it (calls.py, identity.py), how a call is
refused (errors.py) and in which envelope (envelope.py), the records it leaves in the store
(records.py), the metrics it counts (metrics.py), and who sent a request (peer.py: the client
behind trusted proxies). Imports nothing of the proxy: every other
room may import it."""

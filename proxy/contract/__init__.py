"""What the proxy's rooms agree on, and nothing else: the settings it is built from
(settings.py; a plugin's declared beside it), the call as the call path carries it (calls.py,
identity.py), how a call is refused (errors.py) and in which envelope (envelope.py), the
records it leaves in the store (records.py), the metrics it counts (metrics.py), who sent a
request (peer.py: the client behind trusted proxies) and what the HTTP edge found of it
(arrival.py). Imports nothing of the proxy: every other
room may import it."""

"""The proxy as a server: the app's assembly (app.py: the rooms' services, declared in
services.py and fleet.py, started and stopped in dependency order by lifecycle.py, every
setting checked with settings.py, the routes mounted), what every request meets around its
route (http.py: request ids, internal headers, errors in the dialect's envelope), the call
lanes around FastAPI's routing (lanes.py), and the uvicorn server that drains on SIGTERM
(serve.py). The top room: it may import every other."""

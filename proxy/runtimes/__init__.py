"""How the proxy reaches runtime instances: the ``RuntimeClient`` seam (base.py) and its
clients, side by side: ``http.py`` (a runtime server over HTTP; decoding.py reads its answers)
and ``embedded.py`` (simulated nodes in this process)."""

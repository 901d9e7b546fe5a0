"""The benchmarks' harness, shared with the end-to-end tests (tests import from bench, never the
other way): processes.py starts ``talaria serve`` / ``talaria runtime`` subprocesses and a
throwaway PostgreSQL and walks process trees; loadgen.py drives a load of agent sessions over
HTTP and remembers which calls the proxy acknowledged; hostile.py builds hostile request bodies
at the body limit, and lag.py measures an event loop's lag from inside it and serves the proxy
in-process with such a probe (bench/loop_lag.py, tests/integration/test_loop_lag.py)."""

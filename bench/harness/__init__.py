"""The benchmarks' harness, shared with the end-to-end tests (tests import from bench, never the
other way): processes.py starts ``talaria serve`` / ``talaria runtime`` subprocesses and a
throwaway PostgreSQL and walks process trees; loadgen.py drives a load of agent sessions over
HTTP and remembers which calls the proxy acknowledged."""

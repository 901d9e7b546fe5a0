"""Several proxy replicas on one PostgreSQL database (docs/operations.md, "Several replicas"):
each session has one owner replica, found by hashing its identity over the live replicas;
the others forward its calls there."""

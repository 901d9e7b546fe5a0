"""The parts of bench/cluster_live.py: deployment.py starts PostgreSQL, the runtimes and the
proxy replicas; measure.py reads the CPU time of every process and what the store kept;
report.py sets R replicas against one and against the simulator. The drive itself is
bench/harness/trace_drive.py (bench/placement_live.py drives with it too)."""

"""What the engines of one node share, accounted: HBM and host-DRAM bytes (``NodeMemory``, with
its eviction order), the PCIe link (``PcieLink``) and the GPUs' time (``DeviceShare``), in
resources.py and eviction.py; how big a node's memory is, from its server and models, in
sizing.py. The simulated engines keep their weights and KV here; the node's scheduler reads and
asks it. It imports nothing of the runtime but itself."""

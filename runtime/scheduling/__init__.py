"""The per-node slot scheduler: which models are resident, which calls are admitted, where KV
lives.

``node.NodeScheduler`` composes the rest: ``state`` (what the parts share: queues, the current
slot, its records), ``intake`` (the admission pass and the admitted calls), ``loop`` (the plan,
slot closes and transitions), ``holds`` (soft reservations and their KV pins), ``sessions``
(what the node knows of each session), ``node_status`` (the status snapshot routing reads) and
``config``. The rules are pure functions: ``slots`` (slot policy), ``admission`` (admission),
``flags`` (the feature flags and policies); ``resources`` accounts HBM, host KV, the PCIe link
and the GPUs' time.
"""

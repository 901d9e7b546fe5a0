"""The per-node slot scheduler: which models are resident, which calls are admitted, where KV
lives.

``node.NodeScheduler`` composes the rest, each part the one owner of what it changes (the
table in ``state``): ``calls`` (a call's way into the node and out), ``intake`` (the waiting
queues, the admission pass and the admitted calls), ``loop`` (the slot, the plan, slot closes,
transitions and the holds), ``holds`` (the holds and their KV pins),
``sessions`` (the node's view of each session), ``lifecycle`` (a session's life on the node:
its calls' arrivals and ends, hints, moves, ends, and its forgetting), ``node_status`` (the
status snapshot routing reads, reading the others), ``state`` (what they all read, and the
slot's records) and ``config``. The rules are pure functions: ``slots`` (slot policy),
``admission`` (admission), ``flags`` (the feature flags and policies). What the engines share
(HBM, host KV, the PCIe link, the GPUs' time) is accounted in runtime/memory/.
"""

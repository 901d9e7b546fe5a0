"""The per-node slot scheduler: which model is active, which calls are admitted, where KV lives."""

"""Environment for the tests that run real vLLM (CPU build, tiny random-weight models).

Set before vLLM is imported: no Hugging Face Hub access (the tiny models are local
``config.json`` directories), and 1 GiB of CPU KV cache per engine.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

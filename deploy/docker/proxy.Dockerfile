# syntax=docker/dockerfile:1
# The proxy: `talaria serve` with the `proxy` extra (FastAPI, SQLAlchemy, Alembic, asyncpg for
# PostgreSQL). The same image runs the schema migrations (`talaria db upgrade`) and key
# management (`talaria keys ...`). Build from the repository root:
#
#     docker build -f deploy/docker/proxy.Dockerfile -t REGISTRY/talaria-proxy:0.1.0 .
#
# Settings come from TALARIA_* environment variables (docs/operations.md, "Every setting").
# Liveness and readiness are the orchestrator's probes on /healthz and /readyz (no HEALTHCHECK).

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
# A virtual environment at the path it keeps in the final stage (its scripts name it).
RUN python -m venv /opt/talaria \
    && /opt/talaria/bin/pip install "/src[proxy]" \
    && /opt/talaria/bin/python -c "import asyncpg, talaria.proxy.app" \
    && /opt/talaria/bin/talaria --version

FROM python:3.11-slim
ENV PATH=/opt/talaria/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/talaria \
    TALARIA_DATA_DIR=/var/lib/talaria \
    MPLCONFIGDIR=/tmp/matplotlib
RUN groupadd --system --gid 10001 talaria \
    && useradd --system --uid 10001 --gid talaria --home-dir /home/talaria --create-home \
        --shell /usr/sbin/nologin talaria \
    && install -d -o talaria -g talaria -m 0700 /var/lib/talaria
COPY --from=build /opt/talaria /opt/talaria
USER 10001:10001
WORKDIR /home/talaria
EXPOSE 8000
ENTRYPOINT ["talaria"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]

# coding-agent-env as a Hugging Face Space (sdk: docker, app_port: 8000) or anywhere Docker runs.
#
#   docker build -t coding-agent-env .
#   docker run -p 8000:8000 coding-agent-env        # then open http://localhost:8000/web/
#
# BASE_IMAGE: any Debian bookworm-like image with python3 (>= 3.11, with venv). NODE_IMAGE: an image holding
# Node >= 20 at /usr/local/bin/node with npm under /usr/local/lib/node_modules/npm (the official node image).
# Both can be locally built or imported images; tests/image builds from `docker import`ed ones.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:20-bookworm-slim
# The package's extras in the image: the Space's by default; a cluster's server image adds `k8s,postgres`
# (deploy/: `docker build --build-arg EXTRAS=server,ui,k8s,postgres .`).
ARG EXTRAS=server,ui
# The CLI agents installed into the image (OpenCode and Pi: about 560 MB; Terminus, oracle and nop need none).
# `--build-arg AGENTS="opencode pi claude-code codex gemini-cli qwen-code mini-swe-agent"` adds the others
# (about 2.7 GB in all); `coding-agent-env agents list` names them.
ARG AGENTS="opencode pi"

FROM ${NODE_IMAGE} AS node

FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    STATE_DIR=/tmp/coding-agent-env \
    AGENTS_DIR=/opt/coding-agent-env/agents

# bubblewrap for the local sandbox. Inside an unprivileged container user namespaces are usually refused: the
# local backend then uses the isolation tier such a container allows, or refuses commands; it never runs them
# unisolated unless the operator opts in (SANDBOX_ALLOW_UNISOLATED, and with secrets set also
# SANDBOX_ALLOW_UNISOLATED_WITH_SECRETS; see docs/security.md).
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap ca-certificates git procps tini util-linux \
 && rm -rf /var/lib/apt/lists/*

COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/npm
RUN ln -sf ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && ln -sf ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
 && node --version && npm --version

RUN useradd --create-home --uid 1000 user
WORKDIR /app
COPY --chown=user:user . /app
ARG EXTRAS
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-compile "/app[${EXTRAS}]"

# The pinned CLI agents chosen by AGENTS from npm and PyPI into AGENTS_DIR, once, here; never per rollout.
ARG AGENTS
RUN coding-agent-env agents install ${AGENTS} >/dev/null && npm cache clean --force \
 && coding-agent-env agents list ${AGENTS}

USER user
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD python3 -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8000'), timeout=4)"

# Binding all interfaces (HOST=0.0.0.0) is this image's explicit choice: the Space (or `docker run -p`) routes
# port 8000 here. i.e. `uvicorn server.app:app --host 0.0.0.0 --port 8000`; HOST and PORT override both.
ENV HOST=0.0.0.0 PORT=8000
# The server re-executes itself without the operator secrets (OPENAI_API_KEY, HF_TOKEN, API_TOKEN, ...) in its
# environment, so no process it starts inherits them. An exposed Space should set API_TOKEN (docs/security.md).
# A Space with persistent storage mounts it at /data: the results store (every rollout the server runs, the
# Runs view) goes there unless RESULTS_DB says otherwise; without /data it lives in STATE_DIR (lost on restart).
# tini is PID 1: it reaps what sandboxes leave behind (a process killed at a deadline, re-parented to PID 1), which
# uvicorn as PID 1 never would (zombies would pile up over thousands of rollouts). `-e 143`: uvicorn re-raises the
# SIGTERM it stopped on once it has shut down, which is a clean stop: exit 0, as before.
ENTRYPOINT ["/usr/bin/tini", "-e", "143", "--"]
CMD ["sh", "-c", "if [ -z \"${RESULTS_DB:-}\" ] && [ -d /data ] && [ -w /data ]; then export RESULTS_DB=/data/coding-agent-env/results.sqlite RESULTS_FROM_SERVER=${RESULTS_FROM_SERVER:-true}; mkdir -p /data/coding-agent-env; fi; exec uvicorn server.app:app --host \"$HOST\" --port \"$PORT\""]

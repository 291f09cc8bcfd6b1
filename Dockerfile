# github-broker: `serve` (API + poller) by default; `poll` for a poller-only container.
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, in their own layer: rebuilt only when constraints.txt changes (the
# exact versions, from `make constraints`), never on a README or source edit.
COPY constraints.txt ./
RUN pip install -r constraints.txt

# Then the package itself, without resolving anything again.
COPY pyproject.toml README.md LICENSE ./
COPY github_broker ./github_broker
RUN pip install --no-deps . && rm -rf build *.egg-info

# The deployment config; mount your own over /app/config.
COPY config ./config

RUN useradd --system --uid 10001 --home-dir /app broker \
    && mkdir -p /var/lib/github-broker && chown broker /var/lib/github-broker
USER broker

# The state directory keeps the lease signing key the broker generates when none is
# configured: mount a volume there (every serve and poll container the same one).
ENV GITHUB_BROKER_CONFIG_DIR=/app/config \
    GITHUB_BROKER_STATE_DIR=/var/lib/github-broker \
    GITHUB_BROKER_SERVER__HOST=0.0.0.0
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=2).status == 200 else 1)"]

CMD ["github-broker", "serve"]

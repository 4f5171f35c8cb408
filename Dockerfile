# The recommendation service as a slim CPU image (no torch: it installs `.[service]` only).
#
#   docker build -t ficco-service .
#   docker run --rm -p 8000:8000 ficco-service            # then: curl localhost:8000/readyz
#
# .dockerignore limits the build context to the packages, the shipped h200x2 dataset and models/.
# The builder stage installs the package into a venv and makes sure the default model is registered:
# the one in models/ when the repository ships it, else trained from datasets/h200x2 (as `make serve`).

FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY . .
RUN pip install ".[service]"
RUN mkdir -p models datasets && ficco serve --prepare-only

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    FICCO_MODEL_ROOT=/app/models FICCO_DATASET_ROOT=/app/datasets
RUN useradd --create-home --uid 10001 ficco
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
COPY --from=builder --chown=ficco:ficco /src/models models
COPY --from=builder --chown=ficco:ficco /src/datasets datasets
USER ficco
EXPOSE 8000
# /readyz, not /healthz: a container with no loadable model answers 503 and must report unhealthy.
HEALTHCHECK --interval=30s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"]
CMD ["ficco", "serve", "--host", "0.0.0.0"]

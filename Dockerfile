# The recommendation service as a slim CPU image: the wheel with its [service] extra (no torch; XGBoost for
# large batches, numpy for single answers) and the model registry it ships, read-only.
#
#   make image                    # builds, starts it on a free port, checks /readyz, stops it
#   docker build -t ficco-service . && docker run --rm -p 8000:8000 ficco-service
#   docker run --rm -p 8000:8000 -v $PWD/models:/models -e FICCO_MODEL_ROOT=/models ficco-service
#
# .dockerignore limits the build context to what the wheel is built from (tests/ficco/test_packaging.py
# builds and serves it from exactly those files). The builder checks that the default model is there.

FROM python:3.11-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY . .
RUN pip install ".[service]"
RUN cd / && ficco serve --prepare-only

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN useradd --create-home --uid 10001 ficco
COPY --from=builder /opt/venv /opt/venv
WORKDIR /home/ficco
USER ficco
EXPOSE 8000
# /readyz, not /healthz: a container with no loadable model answers 503 and must report unhealthy. The probe
# follows FICCO_PORT (docker run -e FICCO_PORT=9000 -p 9000:9000 ...).
HEALTHCHECK --interval=30s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('FICCO_PORT', '8000'); urllib.request.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=2)"]
CMD ["ficco", "serve", "--host", "0.0.0.0"]

# pvbess-trainer on CUDA 11.8. Build:  docker build -t pvbess-trainer .
# Run:    docker run --gpus all --stop-timeout 120 -v "$PWD/outputs:/app/outputs" pvbess-trainer a2c --budget 2h
FROM nvidia/cuda:11.8.0-cudnn8-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The monitor needs NVML (utility) besides CUDA (compute).
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PVBESS_CONTAINER=1 \
    PATH=/opt/venv/bin:$PATH

# Python 3.11 (Ubuntu 22.04's universe) and tini, so SIGTERM from `docker stop` reaches the trainer.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv tini ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv

# torch 2.7 is the last line built for CUDA 11.8; its torchvision is 0.22.
RUN pip install --no-cache-dir torch==2.7.1 torchvision==0.22.1 --index-url https://download.pytorch.org/whl/cu118

WORKDIR /app
# Dependencies before code: this layer stays cached while only the code changes.
COPY pyproject.toml README.md ./
RUN mkdir -p trainer monitor && touch trainer/__init__.py monitor/__init__.py \
    && pip install --no-cache-dir . \
    && pip uninstall -y pvbess-trainer

COPY trainer ./trainer
COPY monitor ./monitor
COPY launchers ./launchers
RUN pip install --no-cache-dir --no-deps -e . \
    && useradd --create-home --uid 1000 trainer \
    && mkdir -p /app/outputs && chown trainer:trainer /app/outputs

USER trainer
VOLUME /app/outputs

# Healthy while the GPU monitor's heartbeat (its newest record) is fresh.
HEALTHCHECK --interval=60s --timeout=10s --start-period=5m --retries=3 \
    CMD ["python", "-m", "monitor.healthcheck", "--outputs", "/app/outputs", "--max-age", "120"]

ENTRYPOINT ["/usr/bin/tini", "--", "/app/launchers/docker-entrypoint.sh"]
CMD ["all"]

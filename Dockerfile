# pvbess-trainer. Build (CUDA 11.8, torch 2.7.1, the default):  docker build -t pvbess-trainer .
# CUDA 12.8 (RTX 50xx needs it):  docker build -t pvbess-trainer:cu128 \
#     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 --build-arg TORCH=2.7.1 --build-arg TORCHVISION=0.22.1 .
# Run:  docker compose up   (compose.yaml), or
#       docker run --gpus all --user "$(id -u):$(id -g)" --stop-timeout 120 --shm-size 1g \
#           -v "$PWD/outputs:/app/outputs" pvbess-trainer a2c --budget 2h
#
# The torch CUDA wheels bring their own CUDA runtime and cuDNN (nvidia-* packages), so the base
# is plain Ubuntu: a cuda/cudnn base image would ship the same libraries twice. The host's
# driver comes in through the NVIDIA container toolkit (--gpus all).
FROM ubuntu:22.04

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu118
# torch 2.7 is the last line built for CUDA 11.8; its torchvision is 0.22.
ARG TORCH=2.7.1
ARG TORCHVISION=0.22.1

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    # The monitor needs NVML (utility) besides CUDA (compute).
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PVBESS_CONTAINER=1 \
    # Any --user works: caches go where every uid can write, not to a home it may not have.
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    PATH=/opt/venv/bin:$PATH

# Python 3.11 (Ubuntu 22.04's universe) and tini, so SIGTERM from `docker stop` reaches the trainer.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv tini ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv

RUN pip install --no-cache-dir "torch==${TORCH}" "torchvision==${TORCHVISION}" --index-url "${TORCH_INDEX}"

WORKDIR /app
# Dependencies before code, pinned: this layer stays cached while only the code changes.
COPY pyproject.toml README.md docker/constraints.txt ./
RUN mkdir -p trainer monitor && touch trainer/__init__.py monitor/__init__.py \
    && pip install --no-cache-dir -c constraints.txt . \
    && pip uninstall -y pvbess-trainer

COPY trainer ./trainer
COPY monitor ./monitor
COPY launchers ./launchers
RUN pip install --no-cache-dir --no-deps -c constraints.txt . \
    && useradd --create-home --uid 1000 trainer \
    && mkdir -p /app/outputs && chown trainer:trainer /app/outputs && chmod 1777 /app/outputs

USER trainer
VOLUME /app/outputs

# Healthy while the trainer's own log moves (a progress line at least every minute), GPU or not.
HEALTHCHECK --interval=60s --timeout=10s --start-period=5m --retries=3 \
    CMD ["python", "-m", "trainer.healthcheck", "--outputs", "/app/outputs", "--max-age", "300"]

ENTRYPOINT ["/usr/bin/tini", "--", "/app/launchers/docker-entrypoint.sh"]
CMD ["all"]

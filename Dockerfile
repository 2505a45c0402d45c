# pvbess-trainer. Build (CUDA 11.8, torch 2.7.1, the default):  docker build -t pvbess-trainer .
# CUDA 12.8 (RTX 50xx needs it):  docker build -t pvbess-trainer:cu128 \
#     --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 --build-arg TORCH=2.7.1 --build-arg TORCHVISION=0.22.1 .
# Run:  docker compose up   (compose.yaml), or
#       docker run --gpus all --user "$(id -u):$(id -g)" --stop-timeout 120 --shm-size 1g \
#           -v "$PWD/outputs:/app/outputs" pvbess-trainer a2c --budget 2h
# Tested by docker/smoke.sh (build, quick night as a stranger uid, docker stop, resume, health).
#
# The base is Debian 12 (bookworm), whose python3.11 is 3.11.2 for the life of the release: the
# lock (docker/constraints.txt) is frozen in this very Python by docker/lock.sh, so it installs
# here without a resolver. Torch's CUDA wheels bring their own CUDA runtime and cuDNN (nvidia-*
# packages), so no cuda/cudnn base: it would ship the same libraries twice. The host's driver
# comes in through the NVIDIA container toolkit (--gpus all). BASE and TORCH_INDEX let the same
# file build from a local base and a local torch where Docker Hub and PyTorch's index are out of
# reach (docker/smoke.sh --help).
ARG BASE=debian:bookworm-slim

# ---- python: the interpreter, tini and torch. docker/lock.sh freezes the lock in this stage.
FROM ${BASE} AS python

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    # The monitor needs NVML (utility) besides CUDA (compute).
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PVBESS_CONTAINER=1 \
    # Any --user works: caches go where every uid can write, not to a home it may not have.
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    PATH=/opt/venv/bin:$PATH

# tini, so SIGTERM from `docker stop` reaches the trainer. No compilers: every package is a wheel.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv tini ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* \
    && python3.11 -m venv /opt/venv

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu118
# torch 2.7 is the last line built for CUDA 11.8; its torchvision is 0.22.
ARG TORCH=2.7.1
ARG TORCHVISION=0.22.1
RUN pip install "torch==${TORCH}" "torchvision==${TORCHVISION}" --index-url "${TORCH_INDEX}"

# ---- the image
FROM python

WORKDIR /app
# Dependencies before code: this layer stays cached while only the code changes. The lock pins
# every package besides torch's own; --no-deps installs exactly it (nothing to resolve, so no
# backtracking), and docker/lock.py verify proves it whole and importable.
COPY docker/constraints.txt docker/lock.py /tmp/lock/
RUN pip install --no-deps -r /tmp/lock/constraints.txt \
    && python /tmp/lock/lock.py verify /tmp/lock/constraints.txt

COPY pyproject.toml README.md ./
COPY trainer ./trainer
COPY monitor ./monitor
COPY launchers ./launchers
RUN pip install --no-deps . \
    && python /tmp/lock/lock.py verify /tmp/lock/constraints.txt \
    # verify imported matplotlib as root: its caches in /tmp would be unwritable for --user
    && rm -rf /tmp/* build *.egg-info \
    && useradd --uid 1000 --no-create-home --home-dir /tmp trainer \
    && mkdir -p /app/outputs && chown trainer:trainer /app/outputs && chmod 1777 /app/outputs

USER trainer
VOLUME /app/outputs

# Healthy while the trainer's own log moves (a progress line at least every minute), GPU or not.
# PVBESS_HEALTH_MAX_AGE (seconds, default 300) sets how long it may go quiet.
HEALTHCHECK --interval=60s --timeout=10s --start-period=5m --retries=3 \
    CMD ["python", "-m", "trainer.cli.healthcheck", "--outputs", "/app/outputs"]

ENTRYPOINT ["/usr/bin/tini", "--", "/app/launchers/docker-entrypoint.sh"]
CMD ["all"]

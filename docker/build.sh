#!/usr/bin/env bash
# Build the image: docker/build.sh [OPTIONS] [-- DOCKER_BUILD_ARGS...]
#   --tag NAME            image name (default pvbess-trainer)
#   --target STAGE        build up to this stage (docker/lock.sh builds `python`)
#   --base IMAGE          the Debian 12 base (default debian:bookworm-slim)
#   --torch-index URL     where torch comes from (default: the Dockerfile's, PyTorch's cu118 index)
#   --serve-torch SPECS   serve these wheels from this machine instead, e.g.
#                         'torch==2.13.0 torchvision==0.28.0': pip downloads them and their dependencies
#                         here and the build reads them from 127.0.0.1 (for machines without PyTorch's index)
# DOCKER (default docker) names the client. Sourced by lock.sh and smoke.sh for the same options.
set -euo pipefail
shopt -s inherit_errexit

PVBESS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKER="${DOCKER:-docker}"
log() { printf '[docker] %s\n' "$*" >&2; }
die() { printf '[docker] error: %s\n' "$*" >&2; exit 2; }

TAG=pvbess-trainer TARGET="" BASE="" TORCH_INDEX="" SERVE_TORCH="" BUILD_EXTRA=()
TORCH_SERVER_PID=""

parse_build_options() {
  while (($#)); do
    case "$1" in
      --tag) TAG="${2:?--tag needs a name}"; shift 2 ;;
      --target) TARGET="${2:?--target needs a stage}"; shift 2 ;;
      --base) BASE="${2:?--base needs an image}"; shift 2 ;;
      --torch-index) TORCH_INDEX="${2:?--torch-index needs a URL}"; shift 2 ;;
      --serve-torch) SERVE_TORCH="${2:?--serve-torch needs requirement specifiers}"; shift 2 ;;
      --) shift; BUILD_EXTRA=("$@"); break ;;
      -h|--help) sed -n '2,/^set -e/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) die "unknown option $1 (see $0 --help)" ;;
    esac
  done
}

# A PEP 503 index of the wheels SERVE_TORCH needs, on 127.0.0.1, for the build's --network host.
serve_torch() {
  local dir port wheel name
  dir="$(mktemp -d)"
  log "downloading ${SERVE_TORCH} and their dependencies to serve them locally"
  # shellcheck disable=SC2086 # SERVE_TORCH is a list of requirement specifiers
  python3 -m pip download -q --only-binary=:all: -d "${dir}/wheels" ${SERVE_TORCH} \
    || die "pip could not download ${SERVE_TORCH}"
  for wheel in "${dir}"/wheels/*.whl; do
    name="$(basename "${wheel}" | cut -d- -f1 | tr 'A-Z_.' 'a-z--')"
    mkdir -p "${dir}/simple/${name}" && mv "${wheel}" "${dir}/simple/${name}/"
  done
  # The same port each time where it is free: the URL is a build argument, and a new one rebuilds the torch layer.
  port="$(python3 -c 'import socket
s = socket.socket()
try:
    s.bind(("127.0.0.1", 8765))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
  python3 -m http.server --bind 127.0.0.1 --directory "${dir}" "${port}" >/dev/null 2>&1 &
  TORCH_SERVER_PID=$!
  TORCH_INDEX="http://127.0.0.1:${port}/simple"
  local spec version
  for spec in ${SERVE_TORCH}; do
    version="${spec#*==}"
    case "${spec%%==*}" in
      torch) BUILD_EXTRA+=(--build-arg "TORCH=${version%%+*}") ;;
      torchvision) BUILD_EXTRA+=(--build-arg "TORCHVISION=${version%%+*}") ;;
    esac
  done
}

stop_torch_server() { [[ -z "${TORCH_SERVER_PID}" ]] || kill "${TORCH_SERVER_PID}" 2>/dev/null || true; }

build_image() {
  local args=(build --network host -t "${TAG}")
  [[ -z "${SERVE_TORCH}" ]] || serve_torch
  [[ -z "${TARGET}" ]] || args+=(--target "${TARGET}")
  [[ -z "${BASE}" ]] || args+=(--build-arg "BASE=${BASE}")
  [[ -z "${TORCH_INDEX}" ]] || args+=(--build-arg "TORCH_INDEX=${TORCH_INDEX}")
  log "${DOCKER} ${args[*]} ${BUILD_EXTRA[*]} ${PVBESS_ROOT}"
  "${DOCKER}" "${args[@]}" "${BUILD_EXTRA[@]}" "${PVBESS_ROOT}"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  parse_build_options "$@"
  trap stop_torch_server EXIT
  build_image
fi

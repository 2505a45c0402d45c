#!/usr/bin/env bash
# Regenerate docker/constraints.txt in the image's own Python: build the `python` stage (the base,
# Python and torch), `pip install .` into it with the resolver, and freeze what that installed.
#   docker/lock.sh [build.sh's OPTIONS]     e.g. docker/lock.sh --base local/bookworm:minbase \
#                                                  --serve-torch 'torch==2.13.0 torchvision==0.28.0'
# Then rebuild the image; tests/test_docker_lock.py fails while the lock drifts from pyproject.toml.
set -euo pipefail
shopt -s inherit_errexit

# shellcheck source=docker/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/build.sh"

main() {
  parse_build_options "$@"
  TAG="${TAG}:python" TARGET=python
  trap stop_torch_server EXIT
  build_image
  local lock="${PVBESS_ROOT}/docker/constraints.txt" new
  new="$(mktemp)"
  log "resolving pyproject.toml's dependencies in ${TAG} and freezing them"
  tar -C "${PVBESS_ROOT}" -c pyproject.toml README.md trainer monitor docker/lock.py \
    | "${DOCKER}" run --rm -i --network host --entrypoint sh "${TAG}" -c \
      'mkdir /tmp/src && tar -C /tmp/src -x && pip install -q /tmp/src >&2 \
       && python /tmp/src/docker/lock.py freeze /tmp/src/pyproject.toml' >"${new}"
  mv "${new}" "${lock}"
  log "wrote ${lock} ($(grep -vc '^#' "${lock}") packages); rebuild the image to use it"
}

main "$@"

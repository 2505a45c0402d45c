#!/usr/bin/env bash
# The container's entrypoint (under tini): the image already has the project installed,
# so no venv bootstrap. `docker run IMAGE a2c --budget 2h` → trainer launch --agent a2c ...
set -euo pipefail
shopt -s inherit_errexit

main() {
  # The agent (a word anywhere among the options) is read by `trainer launch` itself.
  exec trainer launch --container "$@"
}

main "$@"

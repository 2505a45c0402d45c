#!/usr/bin/env bash
# The container's entrypoint (under tini): the image already has the project installed,
# so no venv bootstrap. `docker run IMAGE a2c --budget 2h` → trainer launch --agent a2c ...
set -euo pipefail
shopt -s inherit_errexit

main() {
  local args=()
  if (($#)) && [[ "$1" =~ ^(all|sac|ppo|a2c|baseline)$ ]]; then
    args=(--agent "$1")
    shift
  fi
  exec trainer launch --container "${args[@]}" "$@"
}

main "$@"

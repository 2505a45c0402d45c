#!/usr/bin/env bash
# The container's entrypoint (under tini): the image already has the project installed,
# so no venv bootstrap. `docker run IMAGE a2c --budget 2h` → trainer launch --container a2c --budget 2h
# (trainer/cli/container.py: the same command, with help and errors in docker run's words).
set -euo pipefail
shopt -s inherit_errexit

main() {
  # The agent (a word anywhere among the options) is read by `trainer launch` itself.
  exec python -m trainer.cli.container "$@"
}

main "$@"

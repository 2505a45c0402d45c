#!/usr/bin/env bash
# Set up .venv (if needed) and launch the night: doctor, GPU monitor, trainer, summary.
#   ./launchers/launch.sh --quick          a small budget: a smoke run of the whole night
#   ./launchers/launch.sh [all|sac|ppo|a2c|baseline] [--config F] [--profile P]   (agent anywhere)
#       [--budget D | --finish-by HH:MM] [--resume [RUN_DIR]] [--monitor | --no-monitor]
#       [--quick] [-- extra trainer options]
# Everything past bootstrapping is `trainer launch` (trainer/cli/launcher.py).
set -euo pipefail
shopt -s inherit_errexit

# shellcheck source=launchers/_bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"

main() {
  ensure_venv "[export,tune]"
  cd "${PVBESS_ROOT}"
  # exec: SIGINT/SIGTERM reach the launcher, which forwards them to the trainer. The agent
  # (a word before or after the options) and --help are handled there too.
  exec "${PVBESS_VENV}/bin/trainer" launch "$@"
}

main "$@"

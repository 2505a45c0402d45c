#!/usr/bin/env bash
# Set up .venv (if needed) and run the night's schedule.
#   ./launchers/launch.sh --quick          a small budget: a smoke run of the whole night
#   ./launchers/launch.sh [all|sac|ppo|a2c|baseline] [--quick] [-- extra trainer options]
set -euo pipefail
shopt -s inherit_errexit

# shellcheck source=launchers/_bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"

usage() {
  sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

main() {
  local agent="all" quick=() extra=()
  while (($#)); do
    case "$1" in
      all | sac | ppo | a2c | baseline) agent="$1" ;;
      --quick) quick=(--quick) ;;
      -h | --help) usage ;;
      --) shift; extra=("$@"); break ;;
      *) log "unknown argument: $1"; usage ;;
    esac
    shift
  done
  ensure_venv ""
  cd "${PVBESS_ROOT}"
  local trainer="${PVBESS_VENV}/bin/trainer"
  case "${agent}" in
    all) exec "${trainer}" schedule "${quick[@]}" "${extra[@]}" ;;
    baseline) exec "${trainer}" baseline "${extra[@]}" ;;
    *) exec "${trainer}" schedule "${quick[@]}" --agents "${agent}" "${extra[@]}" ;;
  esac
}

main "$@"

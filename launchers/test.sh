#!/usr/bin/env bash
# Set up .venv (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
shopt -s inherit_errexit

# shellcheck source=launchers/_bootstrap.sh
source "$(dirname "${BASH_SOURCE[0]}")/_bootstrap.sh"

main() {
  ensure_venv "[dev,ray,export,tune]"
  cd "${PVBESS_ROOT}"
  # The official CityLearn 2022 dataset, where the checkout has it beside it (tests skip otherwise).
  if [[ -z "${CITYLEARN_LOCAL_DATASETS_PATH:-}" && -d "${PVBESS_ROOT}/../shared/citylearn/datasets" ]]; then
    export CITYLEARN_LOCAL_DATASETS_PATH="${PVBESS_ROOT}/../shared/citylearn/datasets"
  fi
  log "ruff: lint (rules in pyproject.toml)"
  "${PVBESS_VENV}/bin/ruff" check trainer monitor tests
  # One worker per core, at most four (each imports torch and CityLearn, and many start nights of their own);
  # a later -n in the arguments wins: -n 0 runs everything in this process, as a debugger wants.
  exec "${PVBESS_VENV}/bin/python" -m pytest -n auto --maxprocesses 4 "$@"
}

main "$@"

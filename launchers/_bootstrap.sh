# shellcheck shell=bash
# Shared by launch.sh and test.sh: find Python 3.11 and make .venv, idempotently.
# Sourced, not run. Everything past bootstrapping lives in Python (the `trainer` CLI).

PVBESS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PVBESS_VENV="${PVBESS_VENV:-${PVBESS_ROOT}/.venv}"
# torch first, pinned, with the torchvision built for it: otherwise citylearn's
# torchvision requirement drags in whatever torch (and CUDA) is newest.
PVBESS_TORCH="${PVBESS_TORCH:-torch==2.13.0 torchvision==0.28.0}"

log() { printf '[pvbess] %s\n' "$*" >&2; }
die() { printf '[pvbess] error: %s\n' "$*" >&2; exit 2; }

find_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.11 python3 python; do
    [[ -n "${candidate}" ]] || continue
    command -v "${candidate}" >/dev/null 2>&1 || continue
    if "${candidate}" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      command -v "${candidate}"
      return 0
    fi
  done
  return 1
}

# The stamp changes when anything that decides the install changes; a match means no reinstall.
install_stamp() {
  { cat "${PVBESS_ROOT}/pyproject.toml"; printf '%s\n' "${PVBESS_TORCH}"; } | sha256sum | cut -d' ' -f1
}

# Up to date: same stamp, and every extra asked for installed (a [dev,ray,export] venv serves a launch's [export]).
venv_current() {
  local extras="$1" stamp_file="${PVBESS_VENV}/.pvbess-install" installed extra
  [[ -x "${PVBESS_VENV}/bin/python" && -f "${stamp_file}" ]] || return 1
  [[ "$(sed -n 1p "${stamp_file}")" == "$(install_stamp)" ]] || return 1
  installed=",$(sed -n 2p "${stamp_file}" | tr -d '[]'),"
  for extra in $(tr -d '[]' <<<"${extras}" | tr ',' ' '); do
    [[ "${installed}" == *",${extra},"* ]] || return 1
  done
}

# The extras asked for and those installed before, as one [a,b] list: a reinstall keeps what a venv had.
merged_extras() {
  local extras="$1" stamp_file="${PVBESS_VENV}/.pvbess-install" all
  all="$(tr -d '[]' <<<"${extras}")"
  [[ -f "${stamp_file}" ]] && all="${all},$(sed -n 2p "${stamp_file}" | tr -d '[]')"
  all="$(tr ',' '\n' <<<"${all}" | sed '/^$/d' | sort -u | paste -sd, -)"
  [[ -n "${all}" ]] && printf '[%s]' "${all}"
  return 0
}

# pip's last lines, then the one-line error: why an install failed, without its whole log.
pip_failed() {
  tail -n 15 "$1" >&2
  die "$2 (pip's whole output: $1)"
}

ensure_venv() {
  local extras="${1:-}" python stamp_file
  stamp_file="${PVBESS_VENV}/.pvbess-install"
  if venv_current "${extras}"; then
    return 0
  fi
  extras="$(merged_extras "${extras}")"
  if [[ ! -x "${PVBESS_VENV}/bin/python" ]]; then
    python="$(find_python)" || die "Python 3.11 not found: install it, or set PYTHON=/path/to/python3.11"
    log "creating ${PVBESS_VENV} with ${python}"
    "${python}" -m venv "${PVBESS_VENV}" || die "could not create ${PVBESS_VENV} (is the venv module installed? apt install python3.11-venv)"
  fi
  local started=${SECONDS} pip_log="${PVBESS_VENV}/pip-install.log"
  # pip's few hundred lines go to a log, not the console: a first launch shows its steps, and pip's last
  # lines where one fails.
  : >"${pip_log}"
  log "installing dependencies (the first run takes a few minutes; pip's output: ${pip_log})"
  log "step 1/2: ${PVBESS_TORCH}"
  # shellcheck disable=SC2086 # PVBESS_TORCH is a list of requirement specifiers
  # --no-compile: pip compiles each package's bytecode on one core (70 s of a 143 s install on 2 cores); it is
  # compiled once, after both steps, on every core.
  "${PVBESS_VENV}/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-compile ${PVBESS_TORCH} \
    >>"${pip_log}" 2>&1 || pip_failed "${pip_log}" "could not install ${PVBESS_TORCH}; set PVBESS_TORCH to the torch you want"
  log "step 1/2 done after $((SECONDS - started)) s; step 2/2: pvbess-trainer${extras} and its dependencies"
  "${PVBESS_VENV}/bin/python" -m pip install --disable-pip-version-check --progress-bar off --no-compile \
    -e "${PVBESS_ROOT}${extras}" >>"${pip_log}" 2>&1 \
    || pip_failed "${pip_log}" "could not install pvbess-trainer into ${PVBESS_VENV}"
  # The bytecode pip left out, on every core (101 s for the whole install where it was 143 s on 2 cores). Its
  # output and status are not kept: a few packages ship files that are not Python 3.11 (templates, old tests), which
  # pip's own compile passes over in silence too; Python compiles what it imports anyway, and this saves every
  # process doing it again (on machines with PYTHONDONTWRITEBYTECODE set, every process would).
  "${PVBESS_VENV}/bin/python" -m compileall -q -j 0 \
    "$("${PVBESS_VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null 2>&1 || true
  printf '%s\n%s\n' "$(install_stamp)" "${extras}" >"${stamp_file}"
  log "environment ready after $((SECONDS - started)) s"
}

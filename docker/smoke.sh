#!/usr/bin/env bash
# Build the image and use it as a user would; exit 0 when every check holds (tests/test_docker.py runs it).
#   docker/smoke.sh [build.sh's OPTIONS]         e.g. where Docker Hub and PyTorch's index are out of reach:
#       docker/smoke.sh --base local/bookworm:minbase --serve-torch 'torch==2.13.0 torchvision==0.28.0'
#   SMOKE_NO_BUILD=1 uses the image --tag names as it is.
# Checks, as a uid the image has never seen (4321, not 1000) with a mounted outputs folder:
#  1. --help speaks of `docker run IMAGE`; a bad option exits 2 with one line and no traceback;
#  2. a quick night ends 0 with results.json and report.md, owned by that uid, without a warning;
#  3. a longer SAC run turns healthy while it trains, unhealthy once the trainer goes quiet
#     (SIGSTOP), and after SIGCONT `docker stop` exits 143 within the stop timeout with a checkpoint
#     written at the stop; `--resume` continues from that very step.
# Every wait polls for its condition under a deadline (no sleep-and-hope). Takes ~6 minutes on 2 cores.
set -euo pipefail
shopt -s inherit_errexit

# shellcheck source=docker/build.sh
source "$(dirname "${BASH_SOURCE[0]}")/build.sh"

USER_ID=4321
STOP_TIMEOUT=60
WORK="" CONTAINER=""
pass() { printf '[smoke] ok: %s\n' "$*" >&2; }
fail() { printf '[smoke] FAILED: %s\n' "$*" >&2; exit 1; }

cleanup() {
  [[ -z "${CONTAINER}" ]] || "${DOCKER}" rm -f "${CONTAINER}" >/dev/null 2>&1 || true
  [[ -z "${WORK}" ]] || rm -rf "${WORK}"
  stop_torch_server
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every second until it succeeds.
wait_for() {
  local limit="$1" what="$2" deadline=$((SECONDS + $1))
  shift 2
  until "$@"; do
    ((SECONDS < deadline)) || fail "waited ${limit} s for ${what}"
    sleep 1
  done
}

run_image() { "${DOCKER}" run --rm --user "${USER_ID}:${USER_ID}" "$@"; }
health() { "${DOCKER}" inspect --format '{{.State.Health.Status}}' "${CONTAINER}"; }
health_is() { [[ "$(health)" == "$1" ]]; }
# The newest checkpoint step of the SAC stage in $1 (an outputs folder), or nothing.
newest_checkpoint() {
  find "$1" -path '*/sac/checkpoints/step_*' -maxdepth 4 -type d -printf '%f\n' 2>/dev/null \
    | sed 's/^step_0*//' | sort -n | tail -1
}
has_checkpoint() { [[ -n "$(newest_checkpoint "$1")" ]]; }
# Signal the trainer process (python -m trainer night) inside the container.
signal_trainer() {
  "${DOCKER}" exec "${CONTAINER}" python -c "
import psutil, signal, sys
hits = [p for p in psutil.process_iter(['cmdline']) if p.info['cmdline'][1:4] == ['-m', 'trainer', 'night']]
assert hits, 'no trainer process'
for p in hits:
    p.send_signal(getattr(signal, sys.argv[1]))" "$1"
}

check_help_and_errors() {
  local out
  out="$(run_image "${TAG}" --help)" || fail "--help exited $?"
  grep -q '^Usage: docker run IMAGE' <<<"${out}" || fail "--help does not describe docker run IMAGE: ${out:0:200}"
  grep -q 'launch.sh' <<<"${out}" && fail "--help speaks of launch.sh inside the image"
  set +e
  out="$(run_image "${TAG}" --no-such-option 2>&1)"
  local code=$?
  set -e
  ((code == 2)) || fail "a bad option exited ${code}, not 2: ${out}"
  grep -q "No such option '--no-such-option'" <<<"${out}" || fail "a bad option is not named: ${out}"
  grep -q Traceback <<<"${out}" && fail "a bad option printed a traceback"
  pass "--help describes docker run IMAGE; a bad option exits 2 naming it"
}

check_quick_night() {
  local outputs="${WORK}/quick" log="${WORK}/quick.log" run
  mkdir -m 0777 "${outputs}"
  run_image -v "${outputs}:/app/outputs" "${TAG}" --quick >"${log}" 2>&1 || { tail -30 "${log}" >&2; fail "--quick exited $?"; }
  run="$(find "${outputs}" -mindepth 1 -maxdepth 1 -type d -name '[!.]*')"
  [[ -f "${run}/results.json" && -f "${run}/report.md" ]] || fail "--quick left no results.json and report.md in ${run}"
  [[ "$(stat -c %u "${run}" "${run}/results.json" "${run}/report.md" | sort -u)" == "${USER_ID}" ]] \
    || fail "the run folder is not owned by uid ${USER_ID}: $(stat -c '%u %n' "${run}" "${run}/results.json")"
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert {"baseline", "sac", "ppo", "a2c"} <= set(r), r' \
    "${run}/results.json" || fail "results.json lacks an agent"
  grep -Eiq '\[warning|warn ' "${log}" && { grep -Ei '\[warning|warn ' "${log}" >&2; fail "a default quick night warned"; }
  pass "quick night as uid ${USER_ID}: results.json and report.md owned by it, no warning"
}

check_stop_health_and_resume() {
  local outputs="${WORK}/long" before after code started run resumed_from
  mkdir -m 0777 "${outputs}"
  # A short health rhythm and max age, so the test sees both states in seconds, not minutes.
  CONTAINER="$("${DOCKER}" run -d --user "${USER_ID}:${USER_ID}" --stop-timeout "${STOP_TIMEOUT}" \
    --health-interval 2s --health-retries 2 --health-start-period 1s -e PVBESS_HEALTH_MAX_AGE=15 \
    -v "${outputs}:/app/outputs" "${TAG}" sac --budget 30m -- --set sac.timesteps=200000)"
  wait_for 600 "the first SAC checkpoint" has_checkpoint "${outputs}"
  wait_for 60 "healthy while training" health_is healthy
  pass "healthy while SAC trains, first checkpoint at step $(newest_checkpoint "${outputs}")"

  signal_trainer SIGSTOP
  wait_for 90 "unhealthy once the trainer goes quiet" health_is unhealthy
  signal_trainer SIGCONT
  pass "unhealthy once the trainer stopped writing its log"

  before="$(newest_checkpoint "${outputs}")"
  started=${SECONDS}
  "${DOCKER}" stop -t "${STOP_TIMEOUT}" "${CONTAINER}" >/dev/null
  code="$("${DOCKER}" inspect --format '{{.State.ExitCode}}' "${CONTAINER}")"
  ((code == 143)) || { "${DOCKER}" logs --tail 30 "${CONTAINER}" >&2; fail "docker stop: exit ${code}, not 143"; }
  ((SECONDS - started < STOP_TIMEOUT)) || fail "docker stop took the whole timeout (killed, not stopped)"
  after="$(newest_checkpoint "${outputs}")"
  ((after > before)) || fail "no checkpoint written at the stop (newest step ${after}, before the stop ${before})"
  "${DOCKER}" logs "${CONTAINER}" 2>&1 | grep -q -- '--resume' || fail "the stopped run does not say how to resume"
  "${DOCKER}" rm "${CONTAINER}" >/dev/null
  pass "docker stop: exit 143 after $((SECONDS - started)) s, checkpoint at step ${after} (was ${before})"

  run="$(find "${outputs}" -mindepth 1 -maxdepth 1 -type d -name '[!.]*' -printf '%f\n')"
  CONTAINER="$("${DOCKER}" run -d --user "${USER_ID}:${USER_ID}" --stop-timeout "${STOP_TIMEOUT}" \
    -v "${outputs}:/app/outputs" "${TAG}" sac --resume "/app/outputs/${run}")"
  resumed() { "${DOCKER}" logs "${CONTAINER}" 2>&1 | grep -q 'resuming.*step='; }
  wait_for 300 "the resumed stage to say where it resumed" resumed
  resumed_from="$("${DOCKER}" logs "${CONTAINER}" 2>&1 | grep 'resuming' | grep -o 'step=[0-9]*' | head -1)"
  [[ "${resumed_from}" == "step=${after}" ]] \
    || { "${DOCKER}" logs --tail 20 "${CONTAINER}" >&2; fail "--resume continued from ${resumed_from}, not step ${after}"; }
  "${DOCKER}" stop -t "${STOP_TIMEOUT}" "${CONTAINER}" >/dev/null
  pass "--resume continued from step ${after}"
}

# compose.yaml as compose reads it: the service runs as the uid given. Running it needs a GPU (its device
# reservation), so without one only its configuration is checked; skipped without a compose client.
check_compose() {
  local compose=()
  if "${DOCKER}" compose version >/dev/null 2>&1; then compose=("${DOCKER}" compose)
  elif command -v docker-compose >/dev/null; then compose=(docker-compose)
  else printf '[smoke] skipped: compose.yaml (no docker compose or docker-compose here)\n' >&2; return 0; fi
  PVBESS_UID="${USER_ID}" PVBESS_GID="${USER_ID}" "${compose[@]}" -f "${PVBESS_ROOT}/compose.yaml" config \
    | grep -Eq "user: '?${USER_ID}:${USER_ID}'?" || fail "compose.yaml does not run as PVBESS_UID:PVBESS_GID"
  pass "compose.yaml runs the service as PVBESS_UID:PVBESS_GID (${compose[*]} config)"
}

main() {
  parse_build_options "$@"
  trap cleanup EXIT
  WORK="$(mktemp -d)"
  chmod 0755 "${WORK}"
  if [[ -z "${SMOKE_NO_BUILD:-}" ]]; then
    build_image >"${WORK}/build.log" 2>&1 || { tail -40 "${WORK}/build.log" >&2; fail "docker build failed"; }
    pass "built ${TAG} ($("${DOCKER}" image inspect --format '{{.Size}}' "${TAG}" | awk '{printf "%.2f GB", $1 / 1e9}'))"
  fi
  check_compose
  check_help_and_errors
  check_quick_night
  check_stop_health_and_resume
  pass "all checks passed"
}

main "$@"

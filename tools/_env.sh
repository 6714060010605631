# Shared set-up for tools/test and tools/demo: a virtualenv with the pinned
# packages, created or reused, and (for tests) Bazel from Debian.
# Sourced, not executed. Sets QAT_ROOT and puts the venv first on PATH.

QAT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QAT_VENV="${QAT_VENV:-$QAT_ROOT/.venv}"

qat_log() { printf '[qat] %s\n' "$*" >&2; }

qat_python() {
  # A Python >= 3.10 to build the venv with.
  for candidate in "${PYTHON:-}" python3.11 python3.12 python3.10 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  qat_log "no Python >= 3.10 found; install python3 and python3-venv (apt-get install -y python3 python3-venv)"
  return 1
}

qat_pip() {
  # pip <args...> with its output appended to the log $1; on failure, the log's tail.
  local log="$1"; shift
  if ! "$QAT_VENV/bin/python" -m pip "$@" >>"$log" 2>&1; then
    qat_log "pip $* failed; the end of $log:"
    tail -n 40 "$log" >&2
    return 1
  fi
}

qat_setup_venv() {
  local stamp="$QAT_VENV/.qat-requirements.sha256"
  local want
  want="$(cat "$QAT_ROOT/requirements.txt" "$QAT_ROOT/requirements-test.txt" "$QAT_ROOT/pyproject.toml" |
    sha256sum | cut -d' ' -f1)"
  if [ ! -x "$QAT_VENV/bin/python" ]; then
    local py; py="$(qat_python)" || return 1
    qat_log "creating virtualenv $QAT_VENV with $py"
    "$py" -m venv "$QAT_VENV" || {
      qat_log "python -m venv failed; on Debian: apt-get install -y python3-venv"; return 1; }
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # pip's output goes to a log, shown only when a step fails.
    local log="$QAT_VENV/.qat-setup.log"
    qat_log "installing pinned packages (requirements-test.txt) into $QAT_VENV (log: $log)"
    : > "$log"
    qat_pip "$log" install --upgrade pip &&
      qat_pip "$log" install --progress-bar off -r "$QAT_ROOT/requirements-test.txt" &&
      # Editable, so `python tools/<tool>.py` imports this checkout's qat.
      qat_pip "$log" install --no-deps -e "$QAT_ROOT" || return 1
    echo "$want" > "$stamp"
  fi
  export PATH="$QAT_VENV/bin:$PATH"
  export VIRTUAL_ENV="$QAT_VENV"
}

qat_setup_bazel() {
  if command -v bazel >/dev/null 2>&1; then return 0; fi
  qat_log "bazel not found: installing Debian's bazel-bootstrap"
  if [ "$(id -u)" != 0 ]; then
    qat_log "installing Bazel needs root: run 'sudo apt-get update && sudo apt-get install -y bazel-bootstrap', or install Bazel 4-6 yourself"
    return 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bazel-bootstrap >/dev/null || {
      qat_log "apt-get install bazel-bootstrap failed"; return 1; }
}

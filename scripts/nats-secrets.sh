#!/usr/bin/env bash
# Creates the Secrets the NATS server and the services of deploy/ need, for
# clusters without cert-manager (docs/install.md, "Credentials and certificates"):
#
#   nats-passwords          every user's password, as the TRAINYARD_NATS_PASSWORD_*
#                           variables deploy/nats/auth.conf reads (NATS pods only)
#   trainyard-nats-<user>   one user's password under the key `password`: each
#                           service mounts its own and no other
#   nats-ca                 the installation's CA (key pair), kept to sign renewals
#   nats-tls                the server certificate (tls.crt, tls.key) and the CA
#                           (ca.crt); the services mount ca.crt alone
#   trainyard-nats-callout  the auth callout's issuer key (issuer.nk, the planner
#                           only) and its public key (issuer.pub), which NATS
#                           reads as TRAINYARD_NATS_CALLOUT_ISSUER from nats-passwords
#
# The issuer key is made by `nats-auth-config --new-callout-issuer`: the
# repository's `cargo run -p trainyard-contracts --bin nats-auth-config`, or the
# program named by $NATS_AUTH_CONFIG.
#
# The users are those of deploy/nats/auth.conf. Run it again after regenerating
# auth.conf: passwords and certificates already in the cluster are kept, and
# missing ones are added.
#
# Usage: scripts/nats-secrets.sh [--namespace NS] [--no-certificates]
#          [--renew-certificate] [--san DNS:name|IP:addr]... [--days N]
#          [--output FILE]
#   --no-certificates     passwords only (deploy/cert-manager/ issues nats-tls)
#   --renew-certificate   issue a new server certificate from the kept CA
#   --san                 an extra subject alternative name of the server
#                         certificate (a LoadBalancer's name, say); repeatable
#   --days                validity of the server certificate (default 365)
#   --output FILE         write the Secrets to FILE (new passwords, new CA) and
#                         change nothing in the cluster
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
namespace=trainyard-system
certificates=true
renew=false
days=365
output=""
extra_sans=()

while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) namespace="$2"; shift 2 ;;
    --no-certificates) certificates=false; shift ;;
    --renew-certificate) renew=true; shift ;;
    --san) extra_sans+=("$2"); shift 2 ;;
    --days) days="$2"; shift 2 ;;
    --output) output="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

for tool in openssl kubectl; do
  command -v "$tool" >/dev/null || { echo "$tool is required" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
manifests="$work/secrets.yaml"
: >"$manifests"

# Reads key $2 of Secret $1 from the cluster; empty when either is missing.
existing() {
  [ -z "$output" ] || return 0
  kubectl -n "$namespace" get secret "$1" -o "jsonpath={.data.$2}" 2>/dev/null | base64 -d 2>/dev/null || true
}

secret_exists() {
  [ -z "$output" ] && kubectl -n "$namespace" get secret "$1" >/dev/null 2>&1
}

# Appends a Secret to the manifests: name, type, then kubectl's --from-* flags.
add_secret() {
  local name="$1" type="$2"
  shift 2
  kubectl create secret generic "$name" --namespace "$namespace" --type "$type" \
    "$@" --dry-run=client -o yaml >>"$manifests"
  echo "---" >>"$manifests"
}

# Passwords: one per user of auth.conf ("user" line, then its "password" line).
users="$(awk '/user: "/ { gsub(/[",]/, "", $2); user = $2 }
              /password: \$/ { sub(/^\$/, "", $2); print user, $2 }' "$root/deploy/nats/auth.conf")"
[ -n "$users" ] || { echo "no users in deploy/nats/auth.conf" >&2; exit 1; }
mkdir "$work/passwords"
server_args=()
while read -r user variable; do
  password="$(existing nats-passwords "$variable")"
  # nats-server reads the variable's value as a configuration value, where a
  # leading digit would make it a number: a letter first.
  [ -n "$password" ] || password="p$(openssl rand -hex 24)"
  printf '%s' "$password" >"$work/passwords/$user"
  server_args+=("--from-file=$variable=$work/passwords/$user")
  add_secret "trainyard-nats-$user" Opaque "--from-file=password=$work/passwords/$user"
done <<<"$users"

# The auth callout's issuer: kept when the cluster has it, else a new one.
issuer_public="$(existing trainyard-nats-callout issuer\\.pub)"
if [ -n "$issuer_public" ]; then
  echo "trainyard-nats-callout exists: kept" >&2
else
  if [ -n "${NATS_AUTH_CONFIG:-}" ]; then
    issuer_public="$("$NATS_AUTH_CONFIG" --new-callout-issuer "$work/issuer.nk")"
  else
    issuer_public="$(cd "$root" && cargo run -q -p trainyard-contracts --bin nats-auth-config -- \
      --new-callout-issuer "$work/issuer.nk")"
  fi
  printf '%s' "$issuer_public" >"$work/issuer.pub"
  add_secret trainyard-nats-callout Opaque "--from-file=issuer.nk=$work/issuer.nk" \
    "--from-file=issuer.pub=$work/issuer.pub"
fi
printf '%s' "$issuer_public" >"$work/issuer-variable"
server_args+=("--from-file=TRAINYARD_NATS_CALLOUT_ISSUER=$work/issuer-variable")
add_secret nats-passwords Opaque "${server_args[@]}"

if $certificates && { $renew || ! secret_exists nats-tls; }; then
  cd "$work"
  if secret_exists nats-ca; then
    existing nats-ca tls\\.crt >ca.crt
    existing nats-ca tls\\.key >ca.key
  else
    openssl req -x509 -newkey rsa:3072 -nodes -days 3650 -subj "/CN=trainyard-nats-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout ca.key -out ca.crt 2>/dev/null
    add_secret nats-ca kubernetes.io/tls --from-file=tls.crt=ca.crt --from-file=tls.key=ca.key
  fi
  # The client Service, the routes' per-pod names (nats-N.nats-cluster), each
  # in its short and fully qualified forms, and localhost for a port-forward.
  # The routes verify each other, so the certificate serves as client too.
  sans="DNS:localhost,DNS:nats,DNS:nats.$namespace,DNS:nats.$namespace.svc,DNS:nats.$namespace.svc.cluster.local"
  sans="$sans,DNS:*.nats-cluster,DNS:*.nats-cluster.$namespace,DNS:*.nats-cluster.$namespace.svc"
  sans="$sans,DNS:*.nats-cluster.$namespace.svc.cluster.local"
  for san in "${extra_sans[@]+"${extra_sans[@]}"}"; do sans="$sans,$san"; done
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' \
    "$sans" >server.ext
  openssl req -newkey rsa:2048 -nodes -subj "/CN=nats.$namespace.svc" \
    -keyout tls.key -out server.csr 2>/dev/null
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
    -days "$days" -extfile server.ext -out tls.crt 2>/dev/null
  add_secret nats-tls kubernetes.io/tls --from-file=tls.crt=tls.crt \
    --from-file=tls.key=tls.key --from-file=ca.crt=ca.crt
  cd - >/dev/null
  echo "server certificate for: $sans (valid $days days)" >&2
elif $certificates; then
  echo "nats-tls exists: kept (--renew-certificate issues a new one)" >&2
fi

if [ -n "$output" ]; then
  cp "$manifests" "$output"
  echo "wrote the Secrets to $output (namespace $namespace)" >&2
else
  kubectl apply -f "$manifests"
fi

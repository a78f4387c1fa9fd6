#!/usr/bin/env bash
# One idempotent set-up path for both README commands (make run / make test):
# installs the Debian packages that are missing, creates .venv and installs ovsproxy into it.
# Re-running it does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# OVSPROXY_EXTRAS: the optional dependencies besides the runtime's (empty: none, as `make run`).
EXTRAS="${OVSPROXY_EXTRAS-test,bench}"

# command -> Debian package that provides it
declare -A PROVIDER=(
  [ovs-vswitchd]=openvswitch-switch
  [ovsdb-server]=openvswitch-switch
  [ovs-ofctl]=openvswitch-switch
  [ovn-northd]=ovn-central  # OVN as a peer in bench (bench peer-ovn): NB/SB schemas, northd
  [ovn-controller]=ovn-host
  [ethtool]=ethtool
  [ip]=iproute2
  [curl]=curl
  [nft]=nftables
  [iptables-restore]=iptables  # kube-proxy's iptables mode as a peer in bench (peer-kube-proxy)
  [conntrack]=conntrack
  [tcpdump]=tcpdump
)
missing=()
for cmd in "${!PROVIDER[@]}"; do
  if ! command -v "$cmd" >/dev/null 2>&1 && ! [ -x "/usr/sbin/$cmd" ]; then
    pkg="${PROVIDER[$cmd]}"
    [[ " ${missing[*]} " == *" $pkg "* ]] || missing+=("$pkg")
  fi
done

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "setup: need Python >= 3.11 as '$PY' (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  missing+=("python3-venv")
fi
# libnftables' Python binding (ovsproxy.steering loads it from here when the venv cannot import it)
if [ ! -f /usr/lib/python3/dist-packages/nftables/__init__.py ]; then
  missing+=("python3-nftables")
fi

if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]}" >&2
    echo "setup: run as root, or first: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
  }
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: note: the OVS sandbox, network namespaces and routes need root (CAP_NET_ADMIN)." >&2
fi

# Reinstall only when the project metadata or the lock changed since the last install, or
# extras are wanted that it did not install.
stamp=".venv/.ovsproxy-installed"
lock="requirements.txt"  # the runtime dependencies, pinned and hashed
meta="$(cat pyproject.toml "$lock" | sha256sum | cut -d' ' -f1)"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
have=""
[ -f "$stamp" ] && have="$(cat "$stamp")"
installed_extras="${have#* }"
current=0
if [ "${have%% *}" = "$meta" ]; then
  current=1
  IFS=',' read -ra wanted <<<"$EXTRAS"
  for extra in "${wanted[@]}"; do
    [[ ",$installed_extras," == *",$extra,"* ]] || current=0
  done
fi
if [ "$current" -eq 0 ]; then
  spec="."
  [ -n "$EXTRAS" ] && spec=".[$EXTRAS]"
  echo "setup: installing ovsproxy${EXTRAS:+[$EXTRAS]} into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  log=".venv/pip-install.log"
  # The runtime dependencies exactly as locked (hash-checked), then ovsproxy and its extras.
  if ! { .venv/bin/python -m pip install -q --require-hashes -r "$lock" &&
         .venv/bin/python -m pip install -q -e "$spec"; } >"$log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$log" >&2
    echo "setup: pip install failed (full log: $log)" >&2
    exit 1
  fi
  echo "$meta $EXTRAS" > "$stamp"
fi

# The real Kubernetes components (kube-apiserver, kube-controller-manager, kube-proxy, kubectl)
# and etcd that the tests, the lab and the benches run, built from the Go module proxy at the
# pins in tools/ (once per machine; scripts/build-kube.sh). `make run` does not need them and
# sets OVSPROXY_KUBE=skip.
if [ "${OVSPROXY_KUBE:-build}" != "skip" ]; then
  scripts/build-kube.sh >/dev/null
fi

#!/usr/bin/env bash
# Builds the real Kubernetes components the tests, the lab and the benches run (never the
# product): kube-apiserver, kube-controller-manager, kube-proxy and kubectl from the pinned
# Go module in tools/kube, etcd from tools/etcd. Once per machine: the binaries go to a folder
# named after a hash of the pins (both go.mod and go.sum), the Go version and the build recipe,
# under
# ${OVSPROXY_KUBE_CACHE:-/var/cache/ovsproxy/kube}; a second run with the same pins builds
# nothing. Go's own caches stay where the machine keeps them (go env GOMODCACHE GOCACHE).
#
#   scripts/build-kube.sh             build if needed; print the folder holding the binaries
#   scripts/build-kube.sh --bin-dir   print that folder only if it is complete (exit 1 if not)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

cache="${OVSPROXY_KUBE_CACHE:-/var/cache/ovsproxy/kube}"
components=(kube-apiserver kube-controller-manager kube-proxy kubectl)

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-kube: no 'go' on PATH: the real Kubernetes components are built with Go >= 1.26" >&2
  exit 1
fi
gover="$(GOTOOLCHAIN=local go env GOVERSION)"
# What decides the binaries: the pins, the Go version and how they are built (RECIPE: change
# it when the go build lines below change, so that machines rebuild).
RECIPE="cgo0 trimpath notest ldflags-s-w version-x 1"
key="$( (cat tools/kube/go.mod tools/kube/go.sum tools/etcd/go.mod tools/etcd/go.sum; \
  echo "$gover $RECIPE") | sha256sum | cut -c1-16)"
dir="$cache/$key"

complete() {
  local c
  for c in "${components[@]}" etcd; do [ -x "$dir/$c" ] || return 1; done
}

if [ "${1:-}" = "--bin-dir" ]; then
  complete || { echo "build-kube: not built for these pins; run scripts/build-kube.sh" >&2; exit 1; }
  echo "$dir"
  exit 0
fi
if complete; then
  echo "$dir"
  exit 0
fi

# The release, read from the pins: k8s.io/kubernetes vX.Y.Z in tools/kube/go.mod.
release="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' tools/kube/go.mod)"
major="${release#v}"; major="${major%%.*}"
minor="${release#v*.}"; minor="${minor%%.*}"
stamp="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
ldflags="-s -w"
# kube-apiserver --version and kubectl version read these (hack/lib/version.sh sets the same).
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$release -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=$stamp"
done

# One build at a time per machine (two set-ups at once wait for each other's build).
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if complete; then
  echo "$dir"
  exit 0
fi
tmp="$cache/.build-$key.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
started=$(date +%s)
echo "build-kube: building Kubernetes $release and etcd into $dir (first build on 2 cores: tens of minutes)" >&2
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
(cd tools/etcd && go build -trimpath -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
(cd tools/kube && go build -trimpath -tags notest -ldflags "$ldflags" -o "$tmp/" \
  $(printf 'k8s.io/kubernetes/cmd/%s ' "${components[@]}"))
for c in "${components[@]}" etcd; do [ -x "$tmp/$c" ] || { echo "build-kube: $c was not built" >&2; exit 1; }; done
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "build-kube: built in $(( $(date +%s) - started )) s" >&2
echo "$dir"

"""What the first build of the real Kubernetes components costs on a fresh machine.

``scripts/build-kube.sh`` run as on a machine that has never built them: Go's module and build
caches and the binaries' cache all pointed at empty folders of a temporary directory (removed
afterwards), so every module is downloaded from the Go module proxy and every package compiled.
Figures: the wall time and the CPU time of the build (its children's), what was downloaded
(the module cache's size), the build cache's size and the binaries' size, with the release and
the Go version. ``--quick`` builds etcd only (tools/etcd), for the benches' own tests.

Not in ``all`` (it takes both cores for a quarter of an hour): run it by name.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NAME = "kube-build"
DESCRIPTION = (
    "the first build of kube-apiserver, kube-controller-manager, kube-proxy, kubectl, etcd"
)
IN_ALL = False

REPO = Path(__file__).resolve().parents[2]


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _pin(module: str, gomod: Path) -> str | None:
    for line in gomod.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == module and len(parts) > 1:
            return parts[1]
    return None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(quick: bool = False) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ovsproxy-kube-build-"))
    try:
        env = {
            **os.environ,
            "GOMODCACHE": str(work / "gomod"),
            "GOCACHE": str(work / "gocache"),
            "GOPATH": str(work / "gopath"),
            "OVSPROXY_KUBE_CACHE": str(work / "bin"),
            "GOFLAGS": "-modcacherw",  # so that the module cache can be removed afterwards
        }
        if not os.access("/usr/local/go/bin/go", os.X_OK) and shutil.which("go") is None:
            return {"error": "no Go toolchain"}
        env["PATH"] = f"/usr/local/go/bin:{env.get('PATH', '')}"
        cpu_before = _children_cpu()
        started = time.perf_counter()
        if quick:
            done = subprocess.run(
                [
                    "go",
                    "build",
                    "-trimpath",
                    "-o",
                    str(work / "bin" / "etcd"),
                    "go.etcd.io/etcd/server/v3",
                ],
                cwd=REPO / "tools" / "etcd",
                env={**env, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"},
                capture_output=True,
                text=True,
            )
        else:
            done = subprocess.run(
                [str(REPO / "scripts" / "build-kube.sh")], env=env, capture_output=True, text=True
            )
        wall = time.perf_counter() - started
        cpu = _children_cpu() - cpu_before
        if done.returncode != 0:
            return {"error": done.stderr[-2000:]}
        go_version = subprocess.run(
            ["go", "env", "GOVERSION"], env=env, capture_output=True, text=True
        ).stdout.strip()
        return {
            "what": "etcd only"
            if quick
            else "kube-apiserver, kube-controller-manager, kube-proxy, kubectl, etcd",
            "kubernetes": _pin("k8s.io/kubernetes", REPO / "tools" / "kube" / "go.mod"),
            "etcd": _pin("go.etcd.io/etcd/server/v3", REPO / "tools" / "etcd" / "go.mod"),
            "go": go_version,
            "cpus": os.cpu_count(),
            "build_s": round(wall, 1),
            "build_cpu_s": round(cpu, 1),
            "downloaded_mb": round(_size(work / "gomod" / "cache" / "download") / 1e6, 1),
            "module_cache_mb": round(_size(work / "gomod") / 1e6, 1),
            "build_cache_mb": round(_size(work / "gocache") / 1e6, 1),
            "binaries_mb": round(_size(work / "bin") / 1e6, 1),
            "goal_build_s": 20 * 60,
            "goal_met": wall <= 20 * 60,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)

"""The benchmarks' own tests (of bench code: the chaos run, the fuzzer, the fake API's
paging, the cluster in kube-apiserver, bench/README.md's rendering), with the suite's session
checks."""

from __future__ import annotations

from support.controlplane import no_leftover_control_planes  # noqa: F401
from support.leftovers import no_leftover_labs, no_leftover_sandboxes  # noqa: F401

from ovsproxy.ovs.ovsdb import _import_ovsdbapp

# Before any test module imports os-ken (and with it eventlet): see _import_ovsdbapp.
_import_ovsdbapp()

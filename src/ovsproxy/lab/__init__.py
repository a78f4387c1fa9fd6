"""Labs: pods (and nodes) built from real parts for the demo, the embedded default and tests.

* ``examples`` — the single-node example lab: pods in one sandbox matching the bundled
  example manifests (``ovsproxy run`` with no flags, ``ovsproxy demo``).
* ``cluster`` — the multi-node lab: nodes with their own OVS and agent on an underlay network
  (``ovsproxy lab up|status|down``, ``ovsproxy demo --nodes N``, tests/lab).
* ``evidence`` — what the rig saw when a request failed (its 5-tuple's conntrack entries,
  counter deltas, drop flows, the agents' state), for the tests, the demo and the benches.

The lab sits at the ovs layer: it builds on ``ovsproxy.ovs`` and runs agents as processes.
"""

from ovsproxy.lab.examples import EXAMPLES, LAB_PODS, LabPod, build_lab

__all__ = ["EXAMPLES", "LAB_PODS", "LabPod", "build_lab"]

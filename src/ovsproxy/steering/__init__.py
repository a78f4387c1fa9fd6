"""Node-side steering of NodePort, external IP and load-balancer IP traffic into OVS.

``desired`` computes what the table must hold (pure), ``render`` writes it as libnftables JSON
(pure), ``table`` is the one owner of the ``inet ovsproxy`` nftables table.
"""

from ovsproxy.steering.desired import (
    NodePortAddresses,
    SteeringDiff,
    SteeringSet,
    SteeringState,
    SteeringTracker,
    apply,
    desired_state,
    diff,
)
from ovsproxy.steering.table import NftablesError, SteeringTable, SyncResult

__all__ = [
    "SteeringDiff",
    "SteeringSet",
    "SteeringState",
    "SteeringTable",
    "SteeringTracker",
    "NftablesError",
    "NodePortAddresses",
    "SyncResult",
    "apply",
    "desired_state",
    "diff",
]

"""Node-side capture of NodePort, external IP and load-balancer IP traffic into OVS.

``desired`` computes what the table must hold (pure), ``render`` writes it as libnftables JSON
(pure), ``table`` is the one owner of the ``inet ovsproxy`` nftables table.
"""

from ovsproxy.capture.desired import (
    CaptureDiff,
    CaptureSet,
    CaptureState,
    CaptureTracker,
    NodePortAddresses,
    apply,
    desired_state,
    diff,
)
from ovsproxy.capture.table import CaptureTable, NftablesError, SyncResult

__all__ = [
    "CaptureDiff",
    "CaptureSet",
    "CaptureState",
    "CaptureTable",
    "CaptureTracker",
    "NftablesError",
    "NodePortAddresses",
    "SyncResult",
    "apply",
    "desired_state",
    "diff",
]

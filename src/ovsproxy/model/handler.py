"""The interfaces sources deliver to: ``SourceHandler`` (Services and EndpointSlices; the change
tracker implements it) and ``ClusterObjectHandler`` for a cluster-scoped kind: as
``ServiceCIDRHandler`` (ServiceCIDRs; ``ovsproxy.servicecidr`` implements it) and as
``NodeHandler`` (this node's Node object; the agent implements it).

Sources convert and validate before calling it, so a handler only ever sees model values:
no Kubernetes object crosses this line. Add and update carry the whole new value; delete
carries the key, because the last value may have been invalid and never delivered.

An object that fails validation is reported through ``on_error`` (one ``InvalidObject``)
and nothing else: the handler keeps whatever it had for it (nothing, or its last valid
version).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from ovsproxy.model import EndpointSlice, Service, ServiceCIDR
from ovsproxy.model.node import Node
from ovsproxy.model.problems import SourceError, SourceProblem

# The names sources pass to ``on_synced``: one per kind of object they have fully listed.
SYNC_SERVICES = "Service"
SYNC_ENDPOINT_SLICES = "EndpointSlice"

_Value_contra = TypeVar("_Value_contra", contravariant=True)


class SourceHandler(Protocol):
    def on_service_add(self, service: Service) -> None: ...

    def on_service_update(self, service: Service) -> None: ...

    def on_service_delete(self, namespace: str, name: str) -> None: ...

    def on_endpoint_slice_add(self, endpoint_slice: EndpointSlice) -> None: ...

    def on_endpoint_slice_update(self, endpoint_slice: EndpointSlice) -> None: ...

    def on_endpoint_slice_delete(self, namespace: str, name: str) -> None: ...

    def on_synced(self, kind: str) -> None:
        """The source has delivered its complete initial list of ``kind`` objects."""

    def on_error(self, problem: SourceProblem) -> None:
        """A rejected object (``InvalidObject``, all its bad fields), an unparsable file, a
        lost connection (``SourceError``): to count. The source has logged it already."""


class ClusterObjectHandler(Protocol[_Value_contra]):
    """Objects of one cluster-scoped kind as model values (ServiceCIDRs, this node's Node).
    Delete carries the name only."""

    def on_add(self, value: _Value_contra) -> None: ...

    def on_update(self, value: _Value_contra) -> None: ...

    def on_delete(self, name: str) -> None: ...

    def on_synced(self) -> None:
        """The source has delivered its complete initial list (for a Node selected by name:
        the one object, or none)."""

    def on_error(self, problem: SourceError) -> None:
        """The list or watch failed (the API may not serve ServiceCIDRs at all)."""


ServiceCIDRHandler = ClusterObjectHandler[ServiceCIDR]
NodeHandler = ClusterObjectHandler[Node]

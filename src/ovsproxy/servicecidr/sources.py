"""Where Service CIDRs come from, and which source wins (pure functions).

Precedence, per IP family:

1. ``configured`` -- ``--service-cidr`` values (repeatable, comma-separated allowed). An operator
   who names the range knows it; nothing overrides it.
2. ``api`` -- the Kubernetes ServiceCIDR API (``networking.k8s.io/v1``, GA in 1.33): the ranges
   the apiserver really allocates from, possibly several per family. Used once its informer has
   synced and it names at least one range of that family.
3. ``aggregated`` -- the longest common prefix of the ClusterIPs seen (what Antrea does when the
   cluster does not say): a subset of the real range that only grows.

Whatever the source, every ClusterIP the proxy knows stays routed: an address outside the
chosen ranges (a misconfiguration, or a ServiceCIDR object that arrives after the Service using
it) is covered by an aggregated "spill-over" prefix of the uncovered addresses. See
``ServiceCIDRDiscoverer``.

ServiceCIDR objects reach this package as ``model.ServiceCIDR`` values: ``ovsproxy.sources``
converts them.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
from collections.abc import Iterable, Mapping

from ovsproxy.model import IPFamily, IPNetwork
from ovsproxy.servicecidr.aggregate import sort_networks

log = logging.getLogger(__name__)


class CIDRSource(enum.StrEnum):
    CONFIGURED = "configured"
    API = "api"
    AGGREGATED = "aggregated"


def parse_configured_cidrs(values: Iterable[str]) -> dict[IPFamily, tuple[IPNetwork, ...]]:
    """Parse ``--service-cidr`` values: each may hold several prefixes separated by commas.

    Strict, because a typo in configuration must stop the agent rather than route a wrong
    range: ``10.96.0.1/12`` (host bits set) is rejected with the prefix it probably meant.
    """
    found: dict[IPFamily, list[IPNetwork]] = {}
    for value in values:
        for part in value.split(","):
            text = part.strip()
            if not text:
                continue
            if "/" not in text:
                raise ValueError(f"--service-cidr {text!r}: a prefix needs a length, e.g. /12")
            try:
                net = ipaddress.ip_network(text, strict=True)
            except ValueError as exc:
                try:
                    hint = ipaddress.ip_network(text, strict=False)
                except ValueError:
                    raise ValueError(f"--service-cidr {text!r}: {exc}") from None
                raise ValueError(
                    f"--service-cidr {text!r} has host bits set; did you mean {hint}?"
                ) from None
            family = IPFamily.of(net)
            if net not in found.setdefault(family, []):
                found[family].append(net)
    return {family: tuple(sort_networks(nets)) for family, nets in found.items()}


def networks_by_family(
    networks: Iterable[IPNetwork],
) -> dict[IPFamily, tuple[IPNetwork, ...]]:
    grouped: dict[IPFamily, list[IPNetwork]] = {}
    for net in networks:
        grouped.setdefault(IPFamily.of(net), []).append(net)
    return {family: tuple(sort_networks(set(nets))) for family, nets in grouped.items()}


def select_source(
    family: IPFamily,
    configured: Mapping[IPFamily, tuple[IPNetwork, ...]],
    api: Mapping[IPFamily, tuple[IPNetwork, ...]] | None,
) -> tuple[CIDRSource, tuple[IPNetwork, ...]]:
    """Which source decides ``family``, and the ranges it names (empty for aggregation).

    ``api`` is ``None`` while the ServiceCIDR informer has not synced or the API is unused.
    """
    if configured.get(family):
        return CIDRSource.CONFIGURED, configured[family]
    if api is not None and api.get(family):
        return CIDRSource.API, api[family]
    return CIDRSource.AGGREGATED, ()

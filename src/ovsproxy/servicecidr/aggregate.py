"""Pure Service CIDR arithmetic: parsing, longest common prefix, covering, reducing.

Everything here is a function of its arguments (no state, no I/O), so the discoverer and the
route manager share one definition of "canonical network" and "covers" (seed 000: the Windows
code compared ``10.96.0.1`` with ``10.96.0.1/32`` as strings and deleted every route).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ovsproxy.model import IPAddress, IPFamily, IPNetwork

# Anything a caller may hand us for an address or a prefix: all spellings collapse to one key.
NetworkLike = str | IPAddress | IPNetwork | ipaddress.IPv4Interface | ipaddress.IPv6Interface
AddressLike = str | IPAddress | IPNetwork | ipaddress.IPv4Interface | ipaddress.IPv6Interface


# The widest prefix aggregation may route, per family. Aggregation guesses a Service range from
# the ClusterIPs it sees, and two ClusterIPs far apart (two ServiceCIDRs, a hostile manifest)
# have a common prefix as short as /0: the node's default route, taken over at metric 0. No
# Service range is that wide: kube-apiserver's allocators refuse IPv4 ranges wider than /12 and
# IPv6 ranges wider than /108 (a 20-bit bitmap); the ServiceCIDR API allows wider ones, but a
# /8 is already 16M Services. So ClusterIPs are grouped by their /8 (IPv4) or /32 (IPv6, an
# ISP's whole allocation) and each group gets its own prefix: never shorter than the floor,
# hence never the default route, nor half the Internet (2000::/3 is inside no /32).
AGGREGATION_FLOOR: dict[IPFamily, int] = {IPFamily.IPv4: 8, IPFamily.IPv6: 32}


# Spellings Kubernetes uses for "no ClusterIP" (headless Services) and an empty field.
_NO_IP = frozenset({"", "none"})


def parse_cluster_ip(value: AddressLike | None) -> IPAddress | None:
    """The address a ClusterIP names, or ``None`` when it names none or is invalid.

    ``10.96.0.1``, ``10.96.0.1/32``, an ``IPv4Address`` and a host ``IPv4Network`` all give the
    same address. Headless (``None``), empty and malformed values give ``None`` so callers can
    skip them; a prefix wider than a host is not a ClusterIP and is skipped too. Scoped IPv6
    addresses (``fe80::1%eth0``) never name a Service and are skipped.
    """
    if value is None:
        return None
    # Interfaces first: IPv4Interface is a subclass of IPv4Address.
    if isinstance(value, ipaddress.IPv4Interface | ipaddress.IPv6Interface):
        return value.ip if value.network.prefixlen == value.max_prefixlen else None
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return None if _scoped(value) else value
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return value.network_address if value.prefixlen == value.max_prefixlen else None
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.lower() in _NO_IP:
        return None
    try:
        if "/" in text:
            net = ipaddress.ip_network(text, strict=True)
            return net.network_address if net.prefixlen == net.max_prefixlen else None
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return None if _scoped(address) else address


def _scoped(address: IPAddress) -> bool:
    return isinstance(address, ipaddress.IPv6Address) and address.scope_id is not None


def to_network(value: NetworkLike) -> IPNetwork:
    """The canonical network for any spelling of an address or prefix.

    Host bits are cleared (``10.96.0.5/24`` -> ``10.96.0.0/24``): a route's destination is the
    prefix, so that is its one identity. Raises ``ValueError`` for anything unparsable.
    """
    if isinstance(value, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return value
    if isinstance(value, ipaddress.IPv4Interface | ipaddress.IPv6Interface):  # before Address
        return value.network
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        if _scoped(value):
            raise ValueError(f"scoped address is not a route destination: {value}")
        return ipaddress.ip_network(value)
    if isinstance(value, str):
        text = value.strip()
        if "%" in text:
            raise ValueError(f"scoped address is not a route destination: {value!r}")
        return ipaddress.ip_network(text, strict=False)
    raise ValueError(f"not an address or network: {value!r}")


def common_prefix(a: IPNetwork, b: IPNetwork | IPAddress) -> IPNetwork:
    """The smallest network that contains both ``a`` and ``b`` (longest common prefix)."""
    if a.version != b.version:
        raise ValueError(f"different IP families: {a} and {b}")
    other = b if isinstance(b, ipaddress.IPv4Network | ipaddress.IPv6Network) else to_network(b)
    width = a.max_prefixlen
    differing = int(a.network_address) ^ int(other.network_address)
    prefix = min(a.prefixlen, other.prefixlen, width - differing.bit_length())
    # The class of ``a``, not ip_network(): an int below 2**32 would otherwise become IPv4.
    return type(a)((int(a.network_address), prefix), strict=False)


def grow(cidr: IPNetwork | None, ip: IPAddress) -> IPNetwork:
    """The CIDR after seeing ``ip``: the host prefix for the first one, else the common prefix.

    Returns ``cidr`` itself (same object) when it already contains ``ip``: growth only.
    """
    if cidr is None:
        return to_network(ip)
    if ip in cidr:
        return cidr
    return common_prefix(cidr, ip)


def service_cidr_for(ips: Iterable[AddressLike | None]) -> dict[IPFamily, IPNetwork]:
    """Per family, the smallest prefix containing every valid ClusterIP in ``ips``.

    Invalid and headless values are skipped; a family with no address is absent. The result
    depends only on the set of addresses, never on their order: the smallest prefix holding a
    set is the common prefix of its lowest and highest member.
    """
    low: dict[IPFamily, int] = {}
    high: dict[IPFamily, int] = {}
    for value in ips:
        ip = parse_cluster_ip(value)
        if ip is None:
            continue
        family = IPFamily.of(ip)
        n = int(ip)
        if family not in low:
            low[family] = high[family] = n
        elif n < low[family]:
            low[family] = n
        elif n > high[family]:
            high[family] = n
    result: dict[IPFamily, IPNetwork] = {}
    for family, lo in low.items():
        cls = ipaddress.IPv4Address if family is IPFamily.IPv4 else ipaddress.IPv6Address
        result[family] = common_prefix(to_network(cls(lo)), cls(high[family]))
    return result


def floor_of(ip: IPAddress) -> IPNetwork:
    """The ``AGGREGATION_FLOOR`` prefix holding ``ip``: aggregation never routes wider."""
    return ipaddress.ip_network((ip, AGGREGATION_FLOOR[IPFamily.of(ip)]), strict=False)


def aggregate(ips: Iterable[AddressLike | None]) -> dict[IPFamily, tuple[IPNetwork, ...]]:
    """Per family, the prefixes aggregation routes for ``ips``: one per ``floor_of`` group, the
    smallest prefix holding that group's addresses (so never shorter than the floor).

    Order-independent, like ``service_cidr_for``: a group's prefix is the common prefix of its
    lowest and highest member. Invalid and headless values are skipped.
    """
    bounds: dict[IPNetwork, tuple[IPAddress, IPAddress]] = {}
    for value in ips:
        ip = parse_cluster_ip(value)
        if ip is None:
            continue
        group = floor_of(ip)
        low, high = bounds.get(group, (ip, ip))
        bounds[group] = (min(low, ip), max(high, ip))
    result: dict[IPFamily, list[IPNetwork]] = {}
    for low, high in bounds.values():
        result.setdefault(IPFamily.of(low), []).append(common_prefix(to_network(low), high))
    return {family: tuple(sort_networks(nets)) for family, nets in result.items()}


def covers(networks: Iterable[IPNetwork], item: IPAddress | IPNetwork) -> bool:
    """Whether some network in ``networks`` contains ``item`` (an address or a whole prefix)."""
    if isinstance(item, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return any(_within(item, n) for n in networks)
    return any(n.version == item.version and item in n for n in networks)


def _within(inner: IPNetwork, outer: IPNetwork) -> bool:
    """Whether ``inner`` lies inside ``outer``; never across families (``subnet_of`` raises)."""
    if isinstance(inner, ipaddress.IPv4Network):
        return isinstance(outer, ipaddress.IPv4Network) and inner.subnet_of(outer)
    return isinstance(outer, ipaddress.IPv6Network) and inner.subnet_of(outer)


def reduce_networks(networks: Iterable[IPNetwork]) -> frozenset[IPNetwork]:
    """Drop every network contained in another one of the set (and duplicates).

    All Service routes share one next hop, so a contained route is redundant. Adjacent prefixes
    are NOT merged (unlike ``ipaddress.collapse_addresses``): merging would invent a range no
    source named. O(n log n): prefixes are nested or disjoint, so in (start, length) order a
    network is contained in some kept one exactly when it is inside the last one kept.
    """
    ordered = sorted(set(networks), key=lambda n: (n.version, int(n.network_address), n.prefixlen))
    kept: list[IPNetwork] = []
    for net in ordered:
        last = kept[-1] if kept else None
        if last is not None and _within(net, last):
            continue
        kept.append(net)
    return frozenset(kept)


def family_of(networks: Iterable[IPNetwork], family: IPFamily) -> tuple[IPNetwork, ...]:
    """The networks of one family, sorted (a stable order for events, logs and commands)."""
    return tuple(sorted((n for n in networks if n.version == family), key=_sort_key))


def _sort_key(net: IPNetwork) -> tuple[int, int, int]:
    return (net.version, int(net.network_address), net.prefixlen)


def sort_networks(networks: Iterable[IPNetwork]) -> list[IPNetwork]:
    """A total order across families (IPv4Network and IPv6Network do not compare)."""
    return sorted(networks, key=_sort_key)

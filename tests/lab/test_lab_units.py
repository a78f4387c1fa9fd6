"""Fast checks (no OVS): the standalone forwarding flows for the multi-node case, the host-SNAT
setting, and the lab's manifests as the manifest source reads them."""

from __future__ import annotations

import ipaddress
import re

import pytest

from ovsproxy.config import ConfigError, load
from ovsproxy.datapath import pipeline as pl
from ovsproxy.datapath.fixed_flows import pipeline_flows
from ovsproxy.datapath.flow_context import Context
from ovsproxy.datapath.pod_flows import pod_forwarding_flows
from ovsproxy.lab.cluster import Lab, LabError, pod_cidrs
from ovsproxy.lab.manifests import LabEndpoint, LabPort, LabService, addresses, endpoint_texts
from ovsproxy.model import IPFamily
from ovsproxy.sources.manifests import parse_manifest

SNAT = addresses("10.244.1.254", "fd00:10:244:1::fffe")


def _ctx(mode: pl.Mode = pl.Mode.STANDALONE, host_snat: tuple = SNAT) -> Context:
    config = pl.PipelineConfig(mode=mode, first_table=10, next_table=20)
    return Context(
        pl.Tables.for_config(config), 1, standalone=mode == pl.Mode.STANDALONE, host_snat=host_snat
    )


def _texts(flows: list) -> list[str]:
    """``table:T priority=P,MATCH actions=ACTIONS`` (cookie left out)."""
    return [re.sub(r" cookie:0x[0-9a-f]+", "", f.to_text()).removeprefix(" ADD ") for f in flows]


def test_standalone_commits_every_new_connection_not_to_a_service() -> None:
    text = "\n".join(_texts(pipeline_flows(_ctx())))
    # new and not to a Service, from the gateway or a local pod (also pod to pod on this
    # bridge: after a vswitchd restart only lost entries are new): committed in ServiceLB
    assert "table:13 priority=1,ip actions=ct(commit,table=20,zone=65520)" in text
    assert "table:13 priority=1,ipv6 actions=ct(commit,table=20,zone=65510)" in text
    # no second commit in L3Forwarding
    assert "table:20 priority=1," not in text


def test_mid_stream_segments_probe_for_a_local_pod() -> None:
    text = "\n".join(_texts(pipeline_flows(_ctx())))
    assert (
        "table:11 priority=100,ct_state=+new+trk,tcp,tcp_flags=-syn-rst actions="
        "set_field:0x4/0x4->reg0,resubmit(,20),set_field:0/0x4->reg0,resubmit(,12),"
        "resubmit(,13)"
    ) in text
    assert "table:20 priority=225,reg0=0x4/0x4 actions=drop" in text
    pod = _texts(pod_forwarding_flows(_ctx(), addresses("10.244.1.10"), "0a:58:00:00:00:01", 7))
    assert (
        "table:20 priority=230,ip,reg0=0x4/0x4,nw_dst=10.244.1.10 actions=set_field:0x8/0x8->reg0"
    ) in pod


def test_node_originated_service_traffic_is_host_snated_and_bounced() -> None:
    text = "\n".join(_texts(pipeline_flows(_ctx())))
    assert "nat(src=10.244.1.254)" in text and "nat(src=fd00:10:244:1::fffe)" in text
    assert (
        "table:10 priority=210,ip,nw_dst=10.244.1.254 actions=ct(table=10,zone=65522,nat)" in text
    )
    assert (
        "table:20 priority=190,ct_state=-rpl+trk,ct_mark=0x10/0x10,ip,dl_dst=aa:bb:cc:dd:ee:ff "
        "actions=ct(commit,table=20,zone=65522,nat(src=10.244.1.254))"
    ) in text
    assert "move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[]" in text


def test_without_host_snat_no_snat_flows() -> None:
    text = "\n".join(_texts(pipeline_flows(_ctx(host_snat=()))))
    assert "zone=65522" not in text and "zone=65512" not in text
    assert "priority=195" in text  # replies to the node still go back out the gateway


def test_integrated_mode_installs_none_of_it() -> None:
    texts = _texts(pipeline_flows(_ctx(pl.Mode.INTEGRATED)))
    text = "\n".join(texts)
    assert "65522" not in text and "aa:bb:cc:dd:ee:ff" not in text
    # the only commit: ConntrackState's forced delete of a stale entry (both modes)
    commits = [t for t in texts if "commit" in t]
    assert len(commits) == 2 and all("ct(commit,force,zone=" in t for t in commits), commits


def test_pod_flows_mark_the_pod_port_and_drop_its_address_from_elsewhere() -> None:
    ips = addresses("10.244.1.10", "fd00:10:244:1::a")
    text = _texts(pod_forwarding_flows(_ctx(), ips, "0a:58:00:00:00:01", 7))
    assert "priority=190,in_port=7 actions=set_field:0x1/0x1->reg0,goto_table:10" in text
    assert "priority=185,ip,nw_src=10.244.1.10 actions=drop" in text
    assert "priority=185,ipv6,ipv6_src=fd00:10:244:1::a actions=drop" in text


def test_host_snat_ip_setting() -> None:
    config = load(host_snat_ip=["10.244.1.254", "fd00:10:244:1::fffe"])
    assert config.pipeline.host_snat_ips == SNAT
    with pytest.raises(ConfigError, match="host_snat_ip: 'nope' is not an IP address"):
        load(host_snat_ip=["nope"])
    with pytest.raises(ConfigError, match="at most one address per IP family"):
        load(host_snat_ip=["10.244.1.254", "10.244.1.253"])


def test_lab_service_manifest_reads_back() -> None:
    endpoints = (
        LabEndpoint("web-1", addresses("10.244.1.10", "fd00:10:244:1::a"), "node-1", "zone-1"),
        LabEndpoint(
            "web-2",
            addresses("10.244.2.10", "fd00:10:244:2::a"),
            "node-2",
            "zone-2",
            ready=False,
            terminating=True,
        ),
    )
    service = LabService(
        "web",
        addresses("10.96.0.10", "fd00:10:96::10"),
        (LabPort("http", 80, 8080), LabPort("dns", 53, 5353, "UDP")),
        endpoints,
        internal_traffic_policy="Local",
        traffic_distribution="PreferSameZone",
        session_affinity_timeout=30,
    )
    parsed = parse_manifest(service.to_yaml(), "web.yaml")
    assert not parsed.problems, parsed.problems
    assert [o.kind for o in parsed.objects] == ["Service", "EndpointSlice", "EndpointSlice"]
    docs = service.documents()
    assert docs[0]["spec"]["internalTrafficPolicy"] == "Local"
    v4 = docs[1]["endpoints"]
    assert v4[0]["hints"] == {"forZones": [{"name": "zone-1"}]}
    assert v4[1]["conditions"] == {"ready": False, "serving": True, "terminating": True}
    assert endpoint_texts(endpoints, 8080) == {
        "10.244.1.10:8080",
        "10.244.2.10:8080",
        "[fd00:10:244:1::a]:8080",
        "[fd00:10:244:2::a]:8080",
    }


def test_lab_agents_get_no_host_snat_flag() -> None:
    """The lab gives its agents nothing a real node's agent would not get: no host-SNAT
    address (the agent derives it and makes its neighbour entry; the lab tests prove it)."""
    from ovsproxy.lab.cluster import Lab, LabNode, pod_cidrs
    from ovsproxy.ovs.sandbox import Sandbox

    node = LabNode("node-1", 1, "zone-1", Sandbox("lu-n1"), (), pod_cidrs(1))
    command = Lab(1).agent_command(node)
    assert "--host-snat-ip" not in command, command
    assert command[command.index("--node-name") + 1] == "node-1"


def test_lab_addressing_and_bad_arguments() -> None:
    v4, v6 = pod_cidrs(12)
    assert v4 == ipaddress.ip_network("10.244.12.0/24")
    assert v6 == ipaddress.ip_network("fd00:10:244:c::/64") and IPFamily.of(v6) is IPFamily.IPv6
    with pytest.raises(LabError, match="zones: 4 is not between 1 and the number of nodes"):
        Lab(3, zones=4)
    with pytest.raises(LabError, match="nodes: 0"):
        Lab(0)
    with pytest.raises(LabError, match="lab name"):
        Lab(2, name="no spaces allowed")


def test_lab_imports_only_the_ovs_layer_and_the_model() -> None:
    """The lab sits at the ovs layer: agents are processes, never imported. (Below it: the
    model, and netns, the bottom layer's namespace helper the evidence reads counters with.)"""
    import ast
    from pathlib import Path

    import ovsproxy.lab

    allowed = ("ovsproxy.lab", "ovsproxy.ovs", "ovsproxy.model", "ovsproxy.netns")
    for path in Path(ovsproxy.lab.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("ovsproxy"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"

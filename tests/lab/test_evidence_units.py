"""Fast checks (no OVS) of the evidence module's readers: /proc/net counters as nstat names
them, and the lines it keeps from conntrack, coverage, datapath and flow dumps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.lab import evidence as ev

SNMP = "Tcp: RtoAlgorithm RetransSegs InErrs\nTcp: 1 7 0\nUdp: InErrors NoPorts\nUdp: 2 3\n"
NETSTAT = "TcpExt: ListenOverflows ListenDrops\nTcpExt: 4 5\n"
SNMP6 = "Udp6InErrors                    	6\nIp6InDiscards 0\n"


def test_proc_net_counters_are_named_as_nstat_names_them() -> None:
    found = ev.parse_proc_net(SNMP, NETSTAT, SNMP6)
    assert found["TcpRetransSegs"] == 7 and found["UdpNoPorts"] == 3
    assert found["TcpExtListenOverflows"] == 4 and found["TcpExtListenDrops"] == 5
    assert found["Udp6InErrors"] == 6 and found["Ip6InDiscards"] == 0


@given(
    st.dictionaries(st.sampled_from(ev.NSTAT_COUNTERS), st.integers(0, 2**40)),
    st.dictionaries(st.sampled_from(ev.NSTAT_COUNTERS), st.integers(0, 2**40)),
)
def test_delta_lists_exactly_the_counters_that_moved(
    before: dict[str, int], after: dict[str, int]
) -> None:
    moved = ev.delta(before, after)
    for name, value in after.items():
        if value != before.get(name, 0):
            assert moved[name] == value - before.get(name, 0)
        else:
            assert name not in moved
    assert set(moved) <= set(after)


def test_conntrack_lines_of_the_tuples_ports_only() -> None:
    pattern = ev._port_pattern([40123, 0])
    text = (
        "tcp,orig=(src=10.244.1.11,dst=10.96.0.10,sport=40123,dport=80),reply=(...)\n"
        "tcp,orig=(src=10.244.1.11,dst=10.96.0.10,sport=140123,dport=80)\n"
        "tcp,orig=(src=10.244.1.12,dst=10.244.1.11,sport=80,dport=40123)\n"
        "tcp      6 117 SYN_SENT src=10.244.1.11 dst=10.96.0.10 sport=40123 dport=80\n"
        "tcp,orig=(src=10.244.1.11,dst=10.96.0.10,sport=4012,dport=80)\n"
    )
    assert len(ev.matching(text, pattern)) == 3
    assert ev.matching(text, ev._port_pattern([0])) == []


def test_only_drop_flows_that_matched_packets() -> None:
    dump = (
        " cookie=0x1, duration=3.2s, table=0, n_packets=3, n_bytes=222, idle_age=1, "
        "priority=9,tcp,tp_src=1 actions=drop\n"
        " cookie=0x1, table=0, n_packets=0, n_bytes=0, priority=9,udp actions=drop\n"
        " cookie=0x1, table=0, n_packets=5, n_bytes=0, priority=9,udp actions=NORMAL\n"
    )
    assert ev.drop_flows(dump) == [
        "cookie=0x1, table=0, n_packets=3, n_bytes=222, priority=9,tcp,tp_src=1 actions=drop"
    ]


def test_coverage_and_port_counters_that_count_trouble() -> None:
    coverage = (
        "Event coverage, avg rate over last: 5 seconds, last minute, last hour\n"
        "drop_action_of_pipeline    0.0/sec     0.000/sec        0.0000/sec   total: 18\n"
        "upcall_flow_limit_hit      0.0/sec     0.000/sec        0.0000/sec   total: 0\n"
        "netdev_sent                0.0/sec     0.000/sec        0.0000/sec   total: 99\n"
    )
    assert ev.coverage_lines(coverage) == ["drop_action_of_pipeline total:18"]
    ports = (
        "  port 2: br0 (tap)\n    RX packets:0 errors:0 dropped:0 overruns:0 frame:0\n"
        "    TX packets:0 errors:0 dropped:3 aborted:0 carrier:0\n"
        "  port 3: p-client-1\n    RX packets:9 errors:0 dropped:0 overruns:0 frame:0\n"
    )
    assert ev.port_trouble(ports) == [
        "port 2: br0 (tap): TX packets:0 errors:0 dropped:3 aborted:0 carrier:0"
    ]


def test_packet_ring_only_when_asked() -> None:
    assert not ev.packet_ring_asked({})
    assert not ev.packet_ring_asked({ev.PACKET_RING_ENV: "0"})
    assert ev.packet_ring_asked({ev.PACKET_RING_ENV: "1"})

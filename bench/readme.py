"""Renders bench/README.md, the one copy of the benchmark figures, from one result file of
``python -m bench all`` (and, for its total wall time, optionally the ``--quick`` one):

    python -m bench.readme bench/results/2026-11-30-all.json \\
        bench/results/2026-11-30-all-quick.json > bench/README.md

Every figure in the text comes from that file (nothing is typed by hand), so bench/README.md
and the committed result always agree; the top README and docs/ link to it and quote none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _mb(size: float) -> str:
    return f"{size / 1e6:.1f} MB"


def _machine(m: dict[str, Any]) -> str:
    parts = [
        f"{m.get('cpus', '?')} vCPU {m.get('cpu', m.get('machine', ''))}".strip(),
        f"{m.get('memory_gb', '?')} GB RAM",
        f"Linux {m.get('kernel', '?')}",
        f"{m.get('implementation', 'Python')} {m.get('python', '?')}",
        f"Open vSwitch {m.get('openvswitch', '?')} (userspace datapath)",
    ]
    return ", ".join(parts)


def _full_sync(fs: dict[str, Any]) -> list[str]:
    out = [
        "### Full sync (`full-sync`)",
        "",
        "A cluster into a fresh ovs-vswitchd: ours from the model values (ServicePorts and",
        "endpoints) through `service_objects`, `SwitchSync.stage` and one streamed bundle to its",
        "commit reply, against `ovs-ofctl --bundle add-groups` + `add-flows` loading the identical",
        "groups and flows from files (written from our values' own text form; process time",
        "included), and against the floor: the same messages pre-encoded and written as one",
        "bundle. Alternating rounds, medians; the template caches are cleared before each",
        "of our runs (an agent's first sync). Same switch content after ours and ofctl:",
        "checked by hash of the dumped flows (and groups where OVS can describe them).",
        "",
        "| Services x endpoints | flows + groups | messages (MB) | ours: build + stage + commit"
        " = total | ovs-ofctl | floor | ours / ofctl | ours / floor | staged -> reply / ofctl |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, r in fs["sizes"].items():
        out.append(
            f"| {size.replace('x', ' x ')} | {r['flows']:,} + {r['groups']:,} "
            f"| {r['messages']:,} ({_mb(r['message_bytes'])}) "
            f"| {r['ours_build_s']:.2f} + {r['ours_stage_s']:.2f} + {r['ours_commit_s']:.2f}"
            f" = **{_s(r['ours_total_s'])}** | {_s(r['ofctl_total_s'])} | {_s(r['floor_s'])} "
            f"| **{r['ratio_vs_ofctl']:.2f}** | {r['ratio_vs_floor']:.2f} "
            f"| {r['ratio_staged_vs_ofctl']:.2f} |"
        )
    head = fs["sizes"][fs["size"]]
    met = fs["ratio_vs_ofctl"] <= fs["target_ratio_vs_ofctl"]
    out += [
        "",
        f"Target (DESIGN.md): within {fs['target_ratio_vs_ofctl']}x of ovs-ofctl at 10,000 x 10."
        f" **{'Met' if met else 'Not met'}: {fs['ratio_vs_ofctl']:.2f}x** "
        f"({_s(head['ours_total_s'])} vs {_s(head['ofctl_total_s'])}). From the staged desired"
        f" state to the commit reply we take {head['ratio_staged_vs_ofctl']:.2f}x ofctl's time;"
        f' building the values takes {_s(head["ours_build_s"])} of our total. See "Where the'
        ' time goes" below.',
        *(
            [
                "",
                f"Goals: <= {fs['goal_ratio_vs_ofctl']}x ovs-ofctl and <= "
                f"{fs['goal_ratio_vs_floor']}x the floor at 10,000 x 10: {_met(fs['goal_met'])}"
                f" ({fs['ratio_vs_ofctl']:.2f}x, {fs['ratio_vs_floor']:.2f}x).",
            ]
            if "goal_met" in fs
            else []
        ),
        "",
    ]
    return out


def _where(fs: dict[str, Any], enc: dict[str, Any] | None) -> list[str]:
    head = fs["sizes"][fs["size"]]
    size = fs["size"].replace("x", " x ")
    templated = enc and "error" not in enc and "dnat_flow_template_us" in enc
    flow_cost = (
        f", built by the codec's templates -- {enc['dnat_flow_template_us']} us to build and"
        f" encode one, against {enc['dnat_flow_us']} us through the generic constructors"
        if templated
        else ""
    )
    out = [
        "### Where the time goes",
        "",
        f"At {size}, our {_s(head['ours_total_s'])}: **building** the values "
        f"{_s(head['ours_build_s'])} (per endpoint a bucket spec and an EndpointDNAT flow"
        f"{flow_cost}; per Service a group spec and a ServiceLB flow), **staging**"
        f" {_s(head['ours_stage_s'])} -- for this first commit that includes planning every"
        " group (as its encoding: no bucket values) and writing the groups and flows into the"
        " commit's bundle as their owners are staged, so Open vSwitch takes them in while the"
        f" rest is still being built -- and the **commit** {_s(head['ours_commit_s'])}: adopting"
        " the switch (its groups and the keys of its flows), writing into the same bundle"
        " whatever was not written while staging, then OVS's commit of the bundle. Cyclic"
        " garbage collection"
        " inside:"
        f" {_s(head['ours_gc_s'])} (the collector is paused while a burst of staging and its"
        " commit run, and the new state is frozen out of its sight afterwards).",
        "",
    ]
    if "ours_cpu_s" in head:
        ovs = head.get("ovs_cpu_ours_s")
        ovs_text = (
            f"; OVS's own CPU time over our run, {_s(ovs)} (ofctl's run:"
            f" {_s(head['ovs_cpu_ofctl_s'])}, the floor's: {_s(head['ovs_cpu_floor_s'])}), is"
            " spent on the other core while we work"
            if ovs is not None
            else ""
        )
        out += [
            f"Our process's CPU time over the sync: {_s(head['ours_cpu_s'])} of the"
            f" {_s(head['ours_total_s'])}; from the bundle's last message to its commit reply,"
            f" {_s(head['ours_tail_s'])} (Open vSwitch finishing and committing the bundle)"
            f"{ovs_text}. So the total is our Python CPU time plus OVS's commit, and what is left"
            " to win is CPU time in CPython: value construction (tuples and byte strings per"
            " value: bucket specs, EndpointDNAT flows, the groups' encodings) and framing each"
            " message into the bundle.",
            "",
        ]
        others = [
            f"{key.replace('x', ' x ')}: {_s(r['ours_cpu_s'])} of CPU, tail {_s(r['ours_tail_s'])}"
            for key, r in fs["sizes"].items()
            if key != fs["size"] and "ours_cpu_s" in r
        ]
        if others:
            out += [
                "The other sizes (our CPU time, and the tail after our last message): "
                + "; ".join(others)
                + ". Where the tail is long, OVS is the bottleneck, not us: a group of thousands"
                " of buckets costs it far more to take in than it costs us to encode.",
                "",
            ]
    if enc and "error" not in enc:
        fast = (
            f"; with the templates and the fast bucket and group constructors,"
            f" {_s(enc['full_sync_build_encode_template_s'])}"
            if "full_sync_build_encode_template_s" in enc
            else ""
        )
        out += [
            f"The codec's own cost to build and encode the same content from scratch"
            f" (`encode` scenario: {enc['full_sync_messages']:,} messages, collector paused):"
            f" {_s(enc['full_sync_build_encode_s'])} through the generic constructors{fast}."
            f" ovs-ofctl, which parses and encodes in C, loads it all in"
            f" {_s(head['ofctl_total_s'])}; the floor, Open vSwitch alone, is"
            f" {_s(head['floor_s'])}.",
            "",
        ]
    return out


def _incremental(inc: dict[str, Any], plot: str) -> list[str]:
    return [
        "### One endpoint change (`incremental`)",
        "",
        f"{inc['services']:,} Services x {inc['endpoints_per_service']} endpoints installed by the"
        " proxier; then one endpoint added to one Service and removed again, through the whole"
        " proxy (EndpointSlice event -> tracker -> proxier -> one bundle -> commit reply).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| event to commit reply (median) | {inc['event_to_commit_ms']:.2f} ms "
        f"({inc['event_to_commit_ms_100_services']:.2f} ms with 100 Services) |",
        f"| GROUP_MODs for the update (`update_group_messages`) | {inc['update_group_messages']} |",
        f"| the INSERT_BUCKET (`insert_bucket_bytes`) | {inc['insert_bucket_bytes']} bytes |",
        f"| everything written for the update (bundle control, INSERT_BUCKET, the endpoint's "
        f"DNAT flow) | {inc['update_wire_bytes']} bytes |",
        f"| the removal: REMOVE_BUCKET | {inc['remove_bucket_bytes']} bytes |",
        f"| unchanged full resync (`noop_messages`, bytes written) | {inc['noop_messages']}, "
        f"{inc['noop_wire_bytes']} |",
        f"| one full MODIFY of the {inc['group_endpoints']}-endpoint group (Antrea's strategy, our "
        f"encoding), sent |"
        f" {inc['full_modify_bytes']} bytes ({inc['ratio_full_modify_vs_ours_bytes']}x ours),"
        f" {inc['full_modify_ms']:.2f} ms |",
        f"| the seed's N+1 GroupMods, sent | {inc['n_plus_1_messages']} messages, "
        f"{inc['n_plus_1_bytes']:,} bytes ({inc['ratio_n_plus_1_vs_ours_bytes']}x ours), "
        f"{inc['n_plus_1_ms']:.2f} ms |",
        f"| first sync through the proxier | {_s(inc['initial_sync_s'])} |",
        "",
        "GROUP_MOD bytes for one added endpoint as the group grows (ours measured live at every"
        " size; the full MODIFY is the exact message; the N+1 sequence is summed from the real"
        " bucket encodings, chunked at the message limit --"
        f" {_mb(inc['bytes_by_group_size'][-1]['n_plus_1_bytes'])} at"
        f" {inc['bytes_by_group_size'][-1]['endpoints']:,} endpoints):",
        "",
        f"![bytes for one endpoint change](results/{Path(plot).name})",
        "",
        "| endpoints | ovsproxy | full MODIFY | N+1 |",
        "|---|---|---|---|",
        *(
            f"| {r['endpoints']:,} | {r['ours_bytes']:,} | {r['full_modify_bytes']:,} "
            f"| {r['n_plus_1_bytes']:,} |"
            for r in inc["bytes_by_group_size"]
        ),
        "",
    ]


def _memory(mem: dict[str, Any]) -> list[str]:
    return [
        "### Memory (`memory`)",
        "",
        f"Resident set size of a fresh process holding {mem['services']:,} Services x "
        f"{mem['endpoints_per_service']} endpoints ({mem['flows']:,} flows, {mem['groups']:,} "
        f"groups): **{mem['rss_total_mb']} MB** in all -- interpreter and imports "
        f"{mem['rss_baseline_mb']} MB, model {mem['model_mb']} MB, desired state (staged: "
        f"flows and groups' buckets as their bytes) {mem['desired_mb']} MB, the commit "
        f"(installed state, after the heap's free pages went back to the OS) "
        f"{mem['installed_mb']} MB. Per Service (the difference to a "
        f"{mem['small_cluster']['services']:,}-Service cluster): **{mem['per_service_kb']} kB**,"
        f" of which the datapath {mem['per_service_datapath_kb']} kB "
        f"({mem['per_endpoint_datapath_bytes']:,} bytes per endpoint) and the model "
        f"{mem['per_service_model_kb']} kB.",
        *(
            [
                "",
                f"Goals: <= {mem['goal_rss_total_mb']} MB in all and <= "
                f"{mem['goal_per_endpoint_datapath_bytes']:,} bytes per endpoint in the "
                f"datapath: {_met(mem['goal_met'])}.",
            ]
            if "goal_met" in mem
            else []
        ),
        "",
    ]


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


_PHASE_NAMES = {
    "start_s": "interpreter start and imports",
    "connect_s": "OVSDB, generation, metrics endpoint, OpenFlow handshake, informers started",
    "list_s": "initial lists (wall), of which:",
    "list_decode_s": "&nbsp;&nbsp;JSON decode of the list pages",
    "list_parse_s": "&nbsp;&nbsp;YAML parse",
    "list_convert_s": "&nbsp;&nbsp;convert (validate, model values)",
    "list_track_s": "&nbsp;&nbsp;track (the change tracker's handlers)",
    "list_http_and_informer_s": "&nbsp;&nbsp;HTTP, the informer, the event loop",
    "list_read_and_deliver_s": "&nbsp;&nbsp;file reads, delivery, the event loop",
    "wait_for_sync_s": "sources synced -> first sync starts",
    "sync_s": "first full sync (wall), of which:",
    "sync_track_s": "&nbsp;&nbsp;track (checkpoint + snapshot)",
    "sync_proxier_s": "&nbsp;&nbsp;proxier (endpoint selection, group ids, status records)",
    "sync_build_s": "&nbsp;&nbsp;build (groups and flows of every Service port)",
    "sync_stage_s": "&nbsp;&nbsp;stage (the datapath's desired state)",
    "sync_commit_s": "&nbsp;&nbsp;commit (plan, encode, stream the bundle, OVS's reply)",
    "after_sync_s": "routes reconciled, healthy",
    "total_s": "**total: spawn -> healthy**",
    "gc_s": "cyclic GC inside all of the above",
}


def _cold_start(cs: dict[str, Any]) -> list[str]:
    api, man, fake = cs["phases_api"], cs["phases_manifests"], cs.get("phases_fake_api")
    rows = []
    for key, label in _PHASE_NAMES.items():
        values = [api.get(key), man.get(key), *([fake.get(key)] if fake else [])]
        if all(v is None for v in values):
            continue
        rows.append(
            f"| {label} | " + " | ".join("" if v is None else f"{v:.2f}" for v in values) + " |"
        )
    decoders = cs["decode_pages_s"]
    e2e = cs["probe_ready_s_by_decoder"]
    cpu = cs.get("probe_cpu_s_by_decoder", {})
    used = cs.get("agent_decoder", "json")
    real = "api_server" in cs  # (older result files: the fake API alone)
    return [
        "### Cold start (`cold-start`)",
        "",
        *_cold_intro(cs, real),
        "",
        "| from | ovsproxy | ovs-ofctl | ratio | goal | agent CPU | agent RSS |",
        "|---|---|---|---|---|---|---|",
        f"| {'kube-apiserver' if real else 'Kubernetes API'} | **{_s(cs['from_api_s'])}**"
        f" | {_s(cs['ofctl_s'])} | **{cs['ratio_api_vs_ofctl']:.2f}x**"
        f" | <= {cs['goal_ratio_api_vs_ofctl']}x: {_met(cs['goal_met'])}"
        f" | {_s(cs['agent_cpu_s_api'])} | {cs['agent_rss_mb_api']} MB |",
        *(
            [
                f"| the fake API (second baseline) | {_s(cs['from_fake_api_s'])}"
                f" | {_s(cs['ofctl_s'])} | {cs['ratio_fake_api_vs_ofctl']:.2f}x | |"
                f" {_s(cs['agent_cpu_s_fake_api'])} | |"
            ]
            if real
            else []
        ),
        f"| manifests | {_s(cs['from_manifests_s'])} | {_s(cs['ofctl_s'])}"
        f" | {cs['ratio_manifests_vs_ofctl']:.2f}x | | | {cs['agent_rss_mb_manifests']} MB |",
        "",
        *(_cold_server(cs) if real else []),
        "Where the time goes (the same agent with timers around the functions that own each"
        " phase, `bench/agent_probe.py`; one run each, seconds):",
        "",
        "| phase | from the API | from manifests |" + (" from the fake API |" if fake else ""),
        "|---|---|---|" + ("---|" if fake else ""),
        *rows,
        "",
        *_cold_memory(cs),
        "JSON decoders for the API's list pages, on the very pages served (best of 3): "
        + ", ".join(f"`{k}` {_s(v)}" for k, v in decoders.items())
        + f"; end to end (the probe, spawn -> healthy, median of {cs['probe_rounds']}): "
        + ", ".join(
            f"`{k}` {_s(v)}" + (f" ({_s(cpu[k])} of CPU)" if k in cpu else "")
            for k, v in e2e.items()
        )
        + (
            " (`msgspec`: into the agent's Structs, then converted; the others: into dicts,"
            " then converted by the agent's dict path)"
            if _typed(cs)
            else ""
        )
        + f". The agent decodes with `{used}`"
        + (
            " (the least CPU time end to end in this run)."
            if cs.get("agent_decoder_wins")
            else "; **in this run another decoder took less CPU time end to end**."
        ),
        "",
    ]


def _cold_intro(cs: dict[str, Any], real: bool) -> list[str]:
    what = (
        f"{cs['services']:,} Services x {cs['endpoints_per_service']} endpoints"
        f" ({cs['flows']:,} flows, {cs['groups']:,} groups) to the agent healthy with everything"
        " committed to a fresh Open vSwitch: `ovsproxy run` started as a subprocess and timed"
        ' from its spawn to its "first sync done" (every Service committed, routes'
        " reconciled; /healthz then answers 200)"
    )
    baseline = (
        "against `ovs-ofctl --bundle` loading the same groups and flows (what the agent"
        " installed, as `ovs-ofctl` dumps it; the same switch content after each:"
        f" {'yes' if cs['same_content'] else '**no**'}). Alternating rounds, medians."
    )
    if not real:
        return [
            f"{what}, reading the fake Kubernetes API over real HTTP ({cs['api_list_pages']}"
            f" list pages of JSON as the API server sends them, 500 objects a page,"
            f" {cs['api_list_mb']} MB), or the same cluster as manifests ({cs['yaml_mb']} MB"
            f" of YAML); {baseline}"
        ]
    load = cs["load"]
    own = _from_file(cs)
    return [
        f"{what}, reading the real kube-apiserver (etcd + kube-apiserver v1.36.3 of"
        " `lab.controlplane`, no controller manager) with the token of the shipped RBAC's"
        f" ServiceAccount: {cs['api_list_pages']} list pages of JSON, 500 objects a page,"
        f" {cs['api_list_mb']} MB. Before the clock starts, the cluster is created in it as the"
        f" admin (`system:masters`): {load['objects']:,} objects in {_s(load['seconds'])}"
        f" ({load['objects_per_s']:,.0f}/s; Services {load['services_per_s']:,.0f}/s,"
        " EndpointSlices written directly"
        f" {load['slices_per_s']:,.0f}/s; 16 requests in flight, `bench/kubeload.py`; a"
        " Service costs more: kube-apiserver also creates the IPAddress object of its"
        " ClusterIP). Second"
        " baseline: the same cluster from the fake API (`bench/kubeapi.py`, pre-encoded list"
        f" pages, {cs['fake_list_pages']} pages, {cs['fake_list_mb']} MB), which separates the"
        " server's serving cost from ours; and the same cluster as manifests"
        f" ({cs['yaml_mb']} MB of YAML). The real server also holds `default/kubernetes`"
        f" (no endpoints: {cs['real_minus_fake_flows']} more flow and group)."
        f" {baseline[0].upper()}{baseline[1:]}" + own
    ]


def _cold_server(cs: dict[str, Any]) -> list[str]:
    parts = [
        f"{name} {_s(u['cpu_s'])} of CPU, {u['rss_mb']} MB RSS (peak {u['peak_rss_mb']} MB)"
        for name, u in cs["server_during_cold_start"].items()
    ]
    return [
        "The API server's own cost while the agent starts (from the spawn to first sync done,"
        " medians, `/proc/<pid>`): "
        + "; ".join(parts)
        + f". The machine's load average as the rounds started: {cs['load_average_at_rounds']}"
        " (other work shares the machine; ratios drift less than times).",
        "",
    ]


def _typed(cs: dict[str, Any]) -> bool:
    """Whether the result is of an agent that decodes the API's JSON into Structs (and keeps
    a resourceVersion per object), not into dicts (that it kept)."""
    return "msgspec-dicts" in cs.get("decode_pages_s", {})


def _cold_memory(cs: dict[str, Any]) -> list[str]:
    api, man = cs.get("memory_api_mb"), cs.get("memory_manifests_mb")
    if not api or not man:
        return []
    stored = "a resourceVersion per object" if _typed(cs) else "the objects as listed"

    def parts(m: dict[str, float], what: str) -> str:
        return (
            f"{m['total_mb']} MB: interpreter and imports {m['imports_mb']} MB, {what} and the"
            f" tracker's model values {m['sources_and_model_mb']} MB, the first sync (desired"
            f" and installed datapath state, the proxier's records) {m['first_sync_mb']} MB"
        )

    return [
        "Where the memory goes (the probe's RSS when healthy): from the API "
        + parts(api, f"the informers' stores ({stored})")
        + "; from manifests "
        + parts(man, "the manifest source's objects")
        + ".",
        "",
    ]


def _churn(ch: dict[str, Any]) -> list[str]:
    rows = []
    windows = list(ch["windows"].values())
    delivery = all("delivery_p50_ms" in w for w in windows)  # (older result files lack it)
    real = "api_server" in ch
    for w in windows:
        goal = ""
        if "goal_p99_met" in w:
            goal = (
                f"p99 <= {w['goal_p99_ms']:g} ms: {_met(w['goal_p99_met'])};"
                f" CPU <= {w['goal_cpu_percent']:g}%: {_met(w['goal_cpu_met'])}"
            )
        cells = [
            f"{w['rate_per_s']:,.0f}/s",
            *([f"{w['achieved_per_s']:,.0f}/s"] if real else []),
            f"{w['min_sync_interval_s']:g} s",
            f"{w['p50_ms']:.1f} / {w['p99_ms']:.1f} / {w['max_ms']:.1f}",
            *([f"{w['delivery_p50_ms']:.1f} / {w['delivery_p99_ms']:.1f}"] if delivery else []),
            f"{w['syncs_per_s']:g}",
            f"{w['messages_per_s']:,.0f}",
            f"{w['bytes_per_s'] / 1e3:,.1f} kB",
            f"{w['agent_cpu_percent']:.0f}%",
            *([" + ".join(f"{v:.0f}%" for v in w["server_cpu_percent"].values())] if real else []),
            goal,
        ]
        rows.append("| " + " | ".join(cells) + " |")
    header = [
        "changes",
        *(["sent"] if real else []),
        "min-sync-interval",
        "p50 / p99 / max ms",
        *(["delivery p50 / p99 ms"] if delivery else []),
        "syncs/s",
        "OpenFlow msgs/s",
        "bytes/s",
        "agent CPU",
        *(["kube-apiserver + etcd CPU"] if real else []),
        "goal",
    ]
    if real:
        load = ch["load"]
        source = (
            " in kube-apiserver (created as the admin before anything is timed:"
            f" {load['objects']:,} objects in {_s(load['seconds'])}) and installed by the agent"
            " (reading with the shipped RBAC's ServiceAccount token), then a steady stream of"
            " EndpointSlice updates written to kube-apiserver as the admin (JSON merge patches,"
            f" {ch['connections']} connections with a request in flight each: sent is the rate"
            " the server took) and reaching the agent through its watch"
        )
        delivered = (
            " Of the latency, the watch's delivery: from the send to the agent's informer"
            " handler (kube-apiserver's write, etcd, its watch cache and stream, the agent's"
            " decode). CPU of kube-apiserver and etcd: the same, over the window."
        )
    else:
        source = (
            " installed from the fake API, then a steady stream of EndpointSlice updates"
            " through its watch"
        )
        delivered = (
            " Of the latency, the watch's delivery: from the send to the agent's informer"
            " handler (the fake API and the generator share the bench's process, whose"
            " setup heap is frozen out of its collector)."
        )
    return [
        "### Endpoint churn (`churn`)",
        "",
        f"{ch['services']:,} Services x {ch['endpoints_per_service']} endpoints"
        + source
        + " (one endpoint change each, on a Service picked at random: a pod goes, or a new pod"
        f" comes), {ch['seconds_per_window']:g} s a window. Latency: from the update's send"
        " to the reply to the commit of the sync that consumed it. CPU: the agent's, all its"
        f" threads, as a share of one core (idle: {ch['idle_cpu_percent']:.1f}%)."
        + (
            f" The goals are judged at the agent's default interval"
            f" ({ch['default_min_sync_interval_s']:g} s): {_met(bool(ch['goals_met']))}."
            if "default_min_sync_interval_s" in ch
            else ""
        )
        + (delivered if delivery else "")
        + _from_file(ch),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *rows,
        "",
    ]


def _from_file(result: dict[str, Any]) -> str:
    """Where a scenario's figures come from its own run, not the ``all`` run's."""
    if not result.get("from_file"):
        return ""
    clean = "" if result.get("clean") else ", tree not clean"
    return (
        f" From `results/{result['from_file']}` (its own run, commit"
        f" `{str(result['commit'])[:12]}`{clean})."
    )


def _scale_server(r: dict[str, Any]) -> str:
    api, etcd = r["server"]["kube-apiserver"], r["server"]["etcd"]
    return (
        f" {_s(api['cpu_s'])} + {_s(etcd['cpu_s'])} | {api['rss_mb']:,.0f} MB"
        f" | {_s(r['load']['seconds'])} |"
    )


def _scale(sc: dict[str, Any], plot: str) -> list[str]:
    real = "api_server" in sc
    rows = [
        f"| {r['services']:,} | {r['flows']:,} | {_s(r['cold_start_s'])}"
        f" | {_s(r['cold_start_cpu_s'])} | {_s(r['ofctl_s'])} | {r['ratio_vs_ofctl']:.2f}x"
        f" | {r['rss_mb']} MB | {r['peak_rss_mb']} MB |" + (_scale_server(r) if real else "")
        for r in sc["sizes"]
    ]
    steps = [
        f"{t['from']:,} -> {t['to']:,}: {t['per_service']} ms of CPU and {m['per_service']} kB"
        f" per added Service ({t['vs_first_step']}x and {m['vs_first_step']}x the first step's)"
        for t, m in zip(sc["cold_start_cpu_growth"], sc["rss_growth"], strict=True)
    ]
    own = _from_file(sc)
    if sc.get("all_failed_with"):
        own = (
            f" From `results/{sc['from_file']}` (its own run, commit `{str(sc['commit'])[:12]}`"
            f"{'' if sc.get('clean') else ', tree not clean'}): in the `all` run the scenario"
            f" failed ({sc.get('all_failed_with', 'error')})."
        )
    return [
        "### Scale (`scale`)",
        "",
        f"Cold start from {'kube-apiserver' if real else 'the API'} (as above, one run a size)"
        " and the agent's memory as the cluster grows (10 endpoints a Service)."
        + (
            " One kube-apiserver holds the cluster, grown to each size before the agent starts"
            " (load: the time to create that step's Services and slices as the admin);"
            " kube-apiserver's and etcd's CPU over the agent's cold start, kube-apiserver's RSS"
            " at its end."
            if real
            else ""
        )
        + own,
        "",
        f"![cold start and RSS by cluster size](results/{Path(plot).name})",
        "",
        "| Services | flows | cold start | agent CPU | ovs-ofctl | ratio | RSS | peak RSS |"
        + (" kube-apiserver + etcd CPU | kube-apiserver RSS | load |" if real else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if real else ""),
        *rows,
        "",
        *_scale_goals(sc),
        "Marginal cost: "
        + "; ".join(steps)
        + ". "
        + " ".join(note[0].upper() + note[1:] + "." for note in sc["not_linear"]),
        "",
    ]


def _scale_goals(sc: dict[str, Any]) -> list[str]:
    if "goal_ratio_vs_ofctl" not in sc:  # (older result files lack them)
        return []
    worst_rss = max(step["per_service"] for step in sc["rss_growth"])
    return [
        f"Goals: cold start <= {sc['goal_ratio_vs_ofctl']}x ovs-ofctl at every size (worst"
        f" {sc['worst_ratio_vs_ofctl']:.2f}x): {_met(sc['goal_ratio_met'])}; <="
        f" {sc['goal_rss_per_service_kb']} kB of RSS per added Service at every step (worst"
        f" {worst_rss} kB): {_met(sc['goal_rss_met'])}. ovs-ofctl loads what the agent"
        " installed (its own dump); the same switch content after both:"
        f" {'yes' if sc['same_content'] else '**no**'}.",
        "",
    ]


def _chaos(ch: dict[str, Any], source: str) -> list[str]:
    """The chaos run (its own result file: ``all`` does not run it)."""
    goals = [
        f"| {g['goal']} | {g['target']} | **{g['value']}** | {_met(bool(g['met']))} |"
        for g in ch["goals"]
    ]
    kinds = [
        f"| `{kind}` | {row['faults']} | {row['requests']:,} | {row['failed']} "
        f"| {row['worst_converge_s']} |"
        for kind, row in ch["by_kind"].items()
    ]
    load = ch.get("load_average_start", ["?"])[0]
    resolution = []
    if "faults_clean_at_first_check" in ch:
        resolution = [
            "A convergence time is an upper bound: it ends with the first clean check. In"
            f" {ch['faults_clean_at_first_check']} of {ch['faults']} faults every node's first"
            " check (desired state built from the API, then the node read and compared) was"
            " already clean, so there the figure is that check's own time (median check"
            f" {ch['median_check_s']} s).",
            "",
        ]
    return [
        "### Chaos (`chaos`)",
        "",
        f"`python -m bench chaos --nodes {ch['nodes']} --minutes {ch['minutes']:g} --seed"
        f" {ch['seed']}` (not part of `all`): a {ch['nodes']}-node dual-stack lab whose agents"
        " read the fake Kubernetes API, under continuous traffic (every node's client pod to a"
        " ClusterIP and a NodePort Service's ClusterIPs, the external client to the NodePort on"
        " every node IP; TCP and UDP, IPv4 and IPv6; a new connection or socket per request),"
        " and a seeded random schedule of faults: endpoint churn, Service add and delete, agent"
        " SIGKILL and restart, ovs-vswitchd kill -9 and restart,"
        + (
            " established connections across a vswitchd kill (six long-lived connections of"
            " the node's client pod, the client, the server or both pushing, through the kill),"
            if "vswitchd-kill-connections" in ch["by_kind"]
            else ""
        )
        + " ovsdb-server kill and restart,"
        " a broken Service (port 70000) appearing then fixed, every watch cut or expired (410,"
        " then a relist) with a change made meanwhile. After each fault `ovsproxy verify` runs"
        " on every node until clean; a fault's requests are those from its start to its"
        " convergence + 1 s. From"
        f" `{source}`{_provenance(ch)}; load average {load} at the start:"
        f" {ch['faults']} faults, {ch['requests']:,} requests, {ch['failed']} failed"
        f" ({ch['failed_outside_fault_windows']} outside the faults' windows).",
        "",
        f"![chaos timeline](results/{Path(ch['plot']).name})",
        "",
        "| goal (issues 17, 27) | target | measured | |"
        if "vswitchd-kill-connections" in ch["by_kind"]
        else "| goal (issue 17) | target | measured | |",
        "|---|---|---|---|",
        *goals,
        "",
        "| fault | times | requests in its windows | failed | slowest convergence (s) |",
        "|---|---|---|---|---|",
        *kinds,
        "",
        *resolution,
    ]


SOAK_RUN = (
    "`python -m bench soak --nodes 3 [--count N] [--churn]` (not part of `all`; `--quick`:"
    " 10,000 requests a phase): a 3-node dual-stack lab; from every node's client pod and the"
    " node's own namespace, new connections (TCP) and new sockets (UDP) to a ClusterIP"
    " Service's IPv4 and IPv6 ClusterIPs and to the NodePort on the next node's IPv4 and IPv6"
    " address, N requests a phase (default 100,000): quiet, then beside a busy loop pinned to"
    " every core (`--churn`: an endpoint leaves and comes back every 2 s meanwhile). A"
    " retransmitted request was answered but needed a TCP retransmission (its connect took"
    " >= 0.9 s, or its connection counted a retransmitted segment). Every failure is in the"
    " result file with its 5-tuple and its evidence, collected when the client reported it"
    " (conntrack of the tuple in every switch and node kernel, counter deltas, drop flows, the"
    " agents' state; with `OVSPROXY_PACKET_RING=1`, the tuple's packets from a bounded ring"
    " capture: [docs/evidence.md](../docs/evidence.md)). Goals (issue 23): 0 failed; 0"
    " retransmitted quiet, <= 0.1% beside the hog."
)


def _soak(so: dict[str, Any] | None) -> list[str]:
    """The soak run (its own result file: ``all`` does not run it)."""
    if so is None:
        return [
            "### Soak (`soak`)",
            "",
            SOAK_RUN,
            "",
            "No full-size run is committed yet: `python -m bench soak --nodes 3` writes"
            " `bench/results/<date>-soak.json`, and `python -m bench.readme` renders it here.",
            "",
        ]
    goals = [
        f"| {g['goal']} | {g['target']} | **{g['value']}** | {_met(bool(g['met']))} |"
        for g in so["goals"]
    ]
    phases = [
        f"| {name} | {ph['requests']:,} | {ph['failed']} | {ph['retransmitted']}"
        f" ({ph['retransmitted_pct']}% of TCP) | {ph['p50_ms']} / {ph['p99_ms']} / {ph['max_ms']}"
        f" | {ph['requests_per_s']:,} | {ph['load_average_start']} |"
        for name, ph in ((n, so[n]) for n in ("quiet", "hog"))
    ]
    churn = f" With `--churn`: {so['churns']} endpoint changes." if so.get("churn") else ""
    stalls = [
        f"{name}: the sampler's longest gap {ph['pressure']['gaps']['longest_s']} s (every"
        f" {ph['pressure']['gaps']['asked_s']} s asked), CPU steal at most"
        f" {ph['pressure']['steal']['worst_share']:.0%} and I/O pressure at most"
        f" {ph['pressure']['io']['worst_share']:.0%} of an interval"
        for name, ph in ((n, so[n]) for n in ("quiet", "hog"))
        if {"gaps", "steal", "io"} <= ph.get("pressure", {}).keys()
    ]
    if stalls:
        churn += " Whether the machine stalled (`bench.pressure`): " + "; ".join(stalls) + "."
    return [
        "### Soak (`soak`)",
        "",
        SOAK_RUN,
        "",
        f"From `{so['source']}`{_provenance(so)}: {so['nodes']} nodes,"
        f" {so['requests_per_phase']:,} requests a phase.{churn}",
        "",
        "| phase | requests | failed | retransmitted | latency p50 / p99 / max ms | requests/s"
        " | load average at the start |",
        "|---|---|---|---|---|---|---|",
        *phases,
        "",
        "| goal (issue 23) | target | measured | |",
        "|---|---|---|---|",
        *goals,
        "",
    ]


_PEER_GOALS = {
    "full_programming": "full programming (OVN installed / our full sync)",
    "restart": "restart on a filled cluster (ovn-controller / our agent)",
    "endpoint_time": "one endpoint added, to installed (OVN / ours)",
    "endpoint_bytes": "its OpenFlow bytes (ours / OVN's)",
    "agent_rss": "RSS (our whole agent / ovn-controller)",
}


def _peer_ovn(po: dict[str, Any]) -> list[str]:
    ours, theirs = po["ours"], po["ovn"]
    batched, per_service, endpoint = theirs["batched"], theirs["per_service"], theirs["endpoint"]
    same, rss = po["same_content"], theirs["rss_mb"]
    ep_ms, ep_bytes = ours["endpoint"]["event_to_commit_ms"], ours["endpoint"]["update_wire_bytes"]
    ovn_sent = ", ".join(f"{n} {kind}" for kind, n in endpoint["add_messages"].items())
    out = [
        f"### OVN as a peer (`peer-ovn`, OVN {po['ovn_version']})",
        "",
        f"The same {po['size'].replace('x', ' x ')} cluster as OVN load balancers (OVN-Kubernetes'"
        " options, in its cluster load-balancer group on one logical switch with local pod"
        " ports), private NB/SB ovsdb-servers, ovn-northd and ovn-controller on the userspace"
        " datapath, in the same run as ours. OVN runs a whole logical network (switching, ARP"
        " responders, ACL and port-security stages, reject and hairpin SNAT, tunnels) and every"
        " change goes through northd's logical flows; we program only the Service proxy.",
        "",
        "| | NB commit | northd | controller | installed | `--wait=hv` |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in (
        (f"batched ({batched['transactions']} transactions)", batched),
        (f"one transaction per Service ({per_service['transactions']:,})", per_service),
    ):
        out.append(
            f"| {label} | {_s(r['nb_commit_s'])} | {_s(r['northd_s'])} | {_s(r['controller_s'])}"
            f" | **{_s(r['installed_s'])}** | {_s(r['wait_hv_s'])} |"
        )
    out += [
        "",
        f"Ours: full sync **{_s(ours['full_sync_s'])}**; one endpoint added {ep_ms:.2f} ms and"
        f" {ep_bytes:,} B against OVN's {endpoint['add_installed_ms']:.0f} ms and"
        f" {endpoint['add_wire_bytes']:,} B ({ovn_sent}); restart {_s(ours['agent_restart_s'])}"
        f" against ovn-controller's {_s(theirs['restart']['restart_s'])}; our whole agent"
        f" {ours['agent_rss_mb']:.0f} MB against ovn-controller {rss['ovn-controller']:.0f} MB,"
        f" ovn-northd {rss['ovn-northd']:.0f} MB, SB {rss['ovsdb-server-sb']:.0f} MB, NB"
        f" {rss['ovsdb-server-nb']:.0f} MB. Flows: ours {ours['flows']:,}, OVN's"
        f" {batched['flows']:,} ({theirs['flows_base']:,} before any load balancer); groups and"
        f" buckets equal: {same['groups'] and same['buckets']}; the VIP answered from a pod on"
        f" both: {same['vip_answered']}. Counting ovn-controller's OpenFlow (a proxy on its"
        f" connections) took {batched.get('tap_parse_s', 0):.2f} s of the bench's time in the"
        " batched load.",
        "",
        "| goal (issue 26) | ratio | goal | |",
        "|---|---|---|---|",
    ]
    for name, row in po["goals"].items():
        label = _PEER_GOALS.get(name, name)
        out.append(f"| {label} | {row['ratio']:.3g} | {row['goal']} | {_met(row['met'])} |")
    return [*out, ""]


def _kube_build(kb: dict[str, Any]) -> list[str]:
    """The first build of the real Kubernetes components (``kube-build``, run by name)."""
    return [
        "### The first build of the real Kubernetes components",
        "",
        f"`scripts/build-kube.sh` on a machine that never built them (Go's caches empty;"
        f" `{kb['source']}`, commit `{str(kb.get('commit'))[:7]}`): Kubernetes"
        f" {kb['kubernetes']} ({kb['what']}) and etcd {kb['etcd']} with {kb['go']} on"
        f" {kb['cpus']} cores took **{kb['build_s'] / 60:.1f} min** (goal 20 min:"
        f" {_met(kb['goal_met'])}; {kb['build_cpu_s'] / 60:.1f} min of CPU), downloaded"
        f" {kb['downloaded_mb']:,.0f} MB of modules, and left {kb['module_cache_mb']:,.0f} MB"
        f" in Go's module cache, {kb['build_cache_mb']:,.0f} MB in its build cache and"
        f" {kb['binaries_mb']:,.0f} MB of binaries. Later set-ups with the same pins build"
        " nothing.",
        "",
    ]


_KP_LABELS = {"ours": "ours", "nftables": "kube-proxy nftables", "iptables": "kube-proxy iptables"}


def _kp_ratio(goal: dict[str, Any], mode: str) -> str:
    ratio = goal["ratio_theirs_over_ours"].get(mode)
    return "-" if ratio is None else f"{ratio:.3g}x"


def _kp_opening(kp: dict[str, Any]) -> list[str]:
    """The opening sentence's ratios against kube-proxy, from the peer run."""
    goals = kp["goals"]
    full, endpoint = goals["full_programming"], goals["endpoint_to_traffic"]
    size = full["figure"].rsplit(" at ", 1)[-1]
    return [
        f"Against kube-proxy {kp['versions']['kube_proxy']} on the same API server and"
        f" content ({size}, `peer-kube-proxy`): full programming to traffic"
        f" {_kp_ratio(full, 'nftables')} faster than its nftables mode and"
        f" {_kp_ratio(full, 'iptables')} than its iptables mode; one endpoint change to"
        f" traffic {_kp_ratio(endpoint, 'nftables')} and {_kp_ratio(endpoint, 'iptables')}.",
        "",
    ]


def _peer_kube_proxy(kp: dict[str, Any]) -> list[str]:
    v = kp["versions"]
    out = [
        f"### kube-proxy as a peer (`peer-kube-proxy`, kube-proxy {v['kube_proxy']})",
        "",
        "Ours and kube-proxy (nftables mode, iptables mode with Debian's"
        f" `{v['iptables']}`) read one kube-apiserver {v['kube_apiserver']} holding the same"
        f" Services x {kp['endpoints']} endpoints; kube-proxy runs in a node namespace of its"
        " own with its KubeProxyConfiguration and Node object, the kernel its datapath; ours"
        ' programs OVS on the userspace datapath. Clocks from the spawn; "answering": every'
        " sampled ClusterIP answers a real connection from a client pod. CPU: the proxy and its"
        " reaped children (nft, iptables-restore); peak RSS: its own (kube-proxy: plus its"
        " largest child seen).",
        "",
        "| Services | proxy | ready | answering | CPU | peak RSS | endpoint to traffic (own"
        " metric) | connect() p50 / p99 | all endpoints answer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, row in kp["per_size"].items():
        for proxy, label in _KP_LABELS.items():
            r = row.get(proxy)
            if not r:
                continue
            p = r["programming"]
            if p.get("ready_s") is None:
                out.append(f"| {int(size):,} | {label} | not within {p['limit_s']:.0f} s |||||||")
                continue
            rss = p["peak_rss_mb"] + (p["children_peak_rss_mb"] if proxy != "ours" else 0)
            extra = (
                f" (+ OVS {p['ovs_cpu_s']:.1f} s, {p['ovs_peak_rss_mb']:.0f} MB)"
                if proxy == "ours"
                else ""
            )
            e, d, c = r["endpoint"], r["datapath"], r["content"]
            out.append(
                f"| {int(size):,} | {label} | {_s(p['ready_s'])} | {_s(p['answering_s'])}"
                f" | {p['cpu_s']:.1f} s{extra} | {rss:.0f} MB | {e['to_traffic_ms']:.0f} ms"
                f" ({e['own_programming_ms']:.0f} ms) | {d['p50_us']:.0f} / {d['p99_us']:.0f} us"
                f" | {c['all_endpoints_answer']} of {c['sampled']} |"
            )
    out += [
        "",
        "Churn (one endpoint changed per write; write to installed from each proxy's own"
        " network-programming histogram, kube-proxy's buckets, so under 0.25 s is coarse):",
        "",
        "| proxy | min sync | rate asked (achieved) | p50 | p99 | mean | CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in (("default_min_sync", "default"), ("min_sync_0", "0")):
        for proxy, windows in kp["churn"][key].items():
            interval = kp["min_sync_default_s"][proxy] if key == "default_min_sync" else 0
            for rate, w in windows.items():
                out.append(
                    f"| {_KP_LABELS[proxy]} | {label} ({interval} s) | {rate}"
                    f" ({w['achieved_per_s']:.0f}/s) | {w['p50_ms']} ms | {w['p99_ms']} ms"
                    f" | {w['mean_ms']} ms | {w['cpu_s']:.1f} s |"
                )
    out += [
        "",
        f"Not run: {kp['not_run'].get('100000', '-')}"
        f" ({kp['load_rate_per_s']:,.0f} objects/s here).",
        "",
        "| goal (issue 38) | ours | nftables | iptables | ratios (theirs / ours) | goal | |",
        "|---|---|---|---|---|---|---|",
    ]
    for goal in kp["goals"].values():
        ratios = goal.get("ratio_theirs_over_ours")
        target = goal["goal"] if isinstance(goal["goal"], str) else goal["goal"]["nftables"]
        out.append(
            f"| {goal['figure']} | {goal['ours']} | {goal['nftables']} | {goal['iptables']}"
            f" | {'-' if ratios is None else ', '.join(f'{m} {_kp_ratio(goal, m)}' for m in ratios)}"  # noqa: E501
            f" | {target} | {_met(goal['goal_met'])} |"
        )
    return [*out, ""]


def _others(report: dict[str, Any]) -> list[str]:
    out = ["### The other scenarios", ""]
    enc = report.get("encode")
    if enc and "error" not in enc:
        out.append(
            f"* `encode`: {enc['ours_per_s']:,} GroupMods/s (10 buckets, cached bucket values; "
            f"target 50,000/s), {enc['ratio']}x os-ken; from scratch {enc['ours_cold_per_s']:,}/s"
            f" ({enc['cold_ratio']}x). EndpointDNAT flow built and encoded: "
            f"{enc['dnat_flow_us']} us"
            + (
                f" ({enc['dnat_flow_template_us']} us by its template)"
                if "dnat_flow_template_us" in enc
                else ""
            )
            + f". A full sync's values built and encoded: "
            f"{_s(enc['full_sync_build_encode_s'])} for {enc['full_sync_messages']:,} messages"
            + (
                f" ({_s(enc['full_sync_build_encode_template_s'])} with the templates)."
                if "full_sync_build_encode_template_s" in enc
                else "."
            )
        )
    load = report.get("load")
    if load and "error" not in load:
        out.append(
            f"* `load`: {load['services']:,} Services from YAML manifests into the tracker in "
            f"{_s(load['load_s'] + load['first_checkpoint_s'])}, {load['ratio_vs_yaml_load']}x "
            f"bare libyaml parsing; one watch event + checkpoint "
            f"{load['one_event_and_checkpoint_us']} us."
        )
    routes = report.get("routes")
    if routes and "error" not in routes:
        out.append(
            f"* `routes`: {routes['cluster_ips_per_family']:,} ClusterIPs per family -> "
            f"{routes['routes_final']} routes in {routes['ops_total']} operations (worst order: "
            f"{routes['worst_order_ops_ipv4']} per family); restart: "
            f"{routes['restart_adds']} adds, {routes['restart_deletes']} deletes; the per-IP "
            f"baseline needs {routes['baseline_per_ip_routes']:,} routes."
        )
    fuzz = report.get("fuzz")
    if fuzz and "error" not in fuzz:
        out.append(
            f"* `fuzz`: {fuzz['inputs']:,} mutated OpenFlow messages (from {fuzz['seeds']} seeds,"
            f" {fuzz['seeds_from_ovs']} recorded from Open vSwitch) through the decoder and the"
            f" stream framer: {fuzz['unexpected_exceptions']} exceptions other than the codec's"
            f" error (goal 0), {fuzz['framing_mismatches']} framing mismatches; slowest decode"
            f" {fuzz['slowest_decode_ms']} ms (goal < {fuzz['goal_slowest_decode_ms']:g} ms);"
            f" {fuzz['inputs_per_s']:,} inputs/s."
        )
        for part, what in (("manifests", "manifest files"), ("watch", "watch events")):
            text = fuzz.get(part)
            if text:
                framing = (
                    f", {text['framing_mismatches']} line-framing mismatches"
                    if "framing_mismatches" in text
                    else ""
                )
                out.append(
                    f"  {text['inputs']:,} mutated {what} ({text['seeds']} seeds): "
                    f"{text['unexpected_exceptions']} unexpected exceptions (goal 0){framing};"
                    f" slowest {text['slowest_ms']} ms; {text['inputs_per_s']:,} inputs/s; "
                    f"peak RSS {text['peak_rss_mib']} MiB."
                )
    http = report.get("http-hostile")
    if http and "error" not in http:
        readers, slow = http["readers"], http["slow_clients"]
        out.append(
            f"* `http-hostile`: {http['services']:,} Services x {http['endpoints']}; "
            f"{readers['clients']} loopback clients reading /status and /dump for "
            f"{readers['seconds']:g} s ({readers['status_reads']} + {readers['dump_reads']} "
            f"reads): {readers['probes_failed']} of {readers['probes']} /healthz probes failed "
            f"(slowest {readers['probe_slowest_ms']} ms; idle {http['idle']['probe_slowest_ms']}"
            f" ms), a Service change installed in {readers['change_installed_s']} s; "
            f"{slow['clients']:,} trickling clients on the node address for {slow['seconds']:g}"
            f" s: {slow['probes_failed']} of {slow['probes']} probes failed (slowest "
            f"{slow['probe_slowest_ms']} ms), at most {slow['most_descriptors_held']} descriptors"
            f" held, {slow['log_lines']} log lines."
        )
    return [*out, ""]


def _provenance(report: dict[str, Any]) -> str:
    """Which commit the figures measured (files written before this was recorded say nothing)."""
    commit = report.get("commit")
    if not commit:
        return ""
    # ("clean": the key of result files written before "tree_clean")
    tree_clean = report.get("tree_clean", report.get("clean"))
    clean = {True: "clean tree", False: "with uncommitted changes"}.get(tree_clean)
    return f", commit `{commit[:12]}`" + (f" ({clean})" if clean else "")


def _wall(report: dict[str, Any]) -> float:
    """The scenarios' time in ``all`` (not that of the newest chaos or soak file shown beside)."""
    return sum(
        v.get("wall_s", 0.0)
        for v in report.values()
        if isinstance(v, dict) and not v.get("outside_all")
    )


def _minutes(report: dict[str, Any]) -> str:
    return f"{_wall(report) / 60:.1f} min here"


def _ok(report: dict[str, Any], name: str) -> bool:
    return name in report and "error" not in report[name]


def render(report: dict[str, Any], source: str, quick_report: dict[str, Any] | None) -> str:
    quick = report.get("quick")
    quick_wall = f"{_wall(quick_report):.0f} s here" if quick_report else "under 2 min"
    fs, inc, mem = report["full-sync"], report["incremental"], report["memory"]
    lines = [
        "## Benchmarks",
        "",
        *(_kp_opening(report["peer-kube-proxy"]) if _ok(report, "peer-kube-proxy") else []),
        "One entry point runs every benchmark; each measures its baseline in the same run and"
        " reports ratios (shared machines drift, ratios much less):",
        "",
        "```sh",
        "scripts/setup.sh                                   # once: venv, OVS, matplotlib",
        f"sudo .venv/bin/python -m bench all                 # full sizes ({_minutes(report)})",
        f"sudo .venv/bin/python -m bench all --quick --json  # one JSON object ({quick_wall})",
        "sudo .venv/bin/python -m bench full-sync           # one scenario",
        "```",
        "",
        "Root is needed for the private OVS sandbox and the network namespaces. `cold-start`,"
        " `churn` and `scale` also start etcd and kube-apiserver of the pinned release"
        " (`ovsproxy.lab.controlplane`; `scripts/setup.sh` builds them once per machine) and"
        " create their cluster in it before any clock starts. Each run writes"
        " `bench/results/<date>-<scenario>[-quick].json` and `.md`, `all` also"
        " `<date>-all[-quick].json`, and `incremental`, `scale` and `chaos` their plots. Every"
        " result file records the commit it measured and whether the tree was clean."
        " `python -m bench.compare BEFORE.json AFTER.json` lists the figures two `all` runs"
        " share and those that moved by more than 5%; `--before FILE... --after FILE...`"
        " compares each figure's median over several result files a side (rounds alternated"
        " between the trees, single scenarios or `all`)"
        " ([`results/2026-12-04-before-after/`](results/2026-12-04-before-after/README.md):"
        " issue 24's before and after, back to back).",
        "",
        f"Figures below: `{source}`{' (quick sizes)' if quick else ''}, on {report['date']}"
        f"{_provenance(report)}: {_machine(report['machine'])}.",
        "",
        *_full_sync(fs),
        *_where(fs, report.get("encode")),
        *_incremental(inc, inc["plot"]),
        *_memory(mem),
        *(_cold_start(report["cold-start"]) if _ok(report, "cold-start") else []),
        *(_churn(report["churn"]) if _ok(report, "churn") else []),
        *(_scale(report["scale"], report["scale"]["plot"]) if _ok(report, "scale") else []),
        *(_chaos(report["chaos"], report["chaos"]["source"]) if _ok(report, "chaos") else []),
        *_soak(report["soak"] if _ok(report, "soak") else None),
        *(_peer_ovn(report["peer-ovn"]) if _ok(report, "peer-ovn") else []),
        *(_kube_build(report["kube-build"]) if _ok(report, "kube-build") else []),
        *(_peer_kube_proxy(report["peer-kube-proxy"]) if _ok(report, "peer-kube-proxy") else []),
        *_others(report),
    ]
    return "\n".join(lines) + "\n"


def _own_result(report: dict[str, Any], result: Path, name: str) -> None:
    """Where the ``all`` run's scenario failed, its own later result file of the same date
    (``<date>-<name>.json``, with its own commit), if there is one."""
    if name not in report or "error" not in report[name]:
        return
    own = result.with_name(f"{report['date']}-{name}.json")
    if not own.exists():
        return
    payload = json.loads(own.read_text())
    if "error" in payload.get(name, {"error": ""}):
        return
    failed = str(report[name]["error"]).split(":", 1)[0]
    report[name] = {**payload[name], "from_file": own.name, "commit": payload.get("commit")}
    report[name]["all_failed_with"] = failed
    report[name]["clean"] = payload.get("tree_clean", payload.get("clean"))


def _newest_result(report: dict[str, Any], result: Path, name: str) -> None:
    """The newest full-size result of ``name`` next to ``result`` (a scenario ``all`` does not
    run: its own run, with its own commit)."""
    if _ok(report, name):
        return
    found = sorted(p for p in result.parent.glob(f"*-{name}.json"))
    if not found:
        return
    payload = json.loads(found[-1].read_text())
    if "error" in payload.get(name, {"error": ""}):
        return
    report[name] = {
        **payload[name],
        "source": f"bench/results/{found[-1].name}",
        "outside_all": True,
        "commit": payload.get("commit"),
        "tree_clean": payload.get("tree_clean"),
    }


def _real_api_result(report: dict[str, Any], result: Path, name: str) -> None:
    """Where the ``all`` run's scenario read the fake API alone, the newest full-size result
    of ``name`` from the real API server (its own run, with its own commit), if there is one."""
    if name in report and "api_server" in report[name]:
        return
    found = [
        p
        for p in sorted(result.parent.glob(f"*-{name}.json"))
        if "api_server" in json.loads(p.read_text()).get(name, {})
    ]
    if not found:
        return
    payload = json.loads(found[-1].read_text())
    report[name] = {
        **payload[name],
        "from_file": found[-1].name,
        "outside_all": True,
        "commit": payload.get("commit"),
        "clean": payload.get("tree_clean"),
    }


def render_files(result: Path, quick: Path | None = None) -> str:
    report = json.loads(result.read_text())
    for name in ("cold-start", "churn", "scale"):
        _real_api_result(report, result, name)
    _own_result(report, result, "scale")
    _newest_result(report, result, "chaos")
    _newest_result(report, result, "soak")
    _newest_result(report, result, "kube-build")
    _newest_result(report, result, "peer-kube-proxy")
    quick_report = json.loads(quick.read_text()) if quick is not None else None
    repo = Path(__file__).resolve().parents[1]
    try:
        source = str(result.resolve().relative_to(repo))
    except ValueError:
        source = str(result)
    return render(report, source, quick_report)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.write(render_files(Path(argv[0]), Path(argv[1]) if len(argv) == 2 else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

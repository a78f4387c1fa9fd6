"""What the node's ``inet ovsproxy`` table differs in from a desired state (pure; for
``ovsproxy verify``).

Compared: the table itself; its chains (name, and for a base chain its type, hook, priority
and policy) and how many rules each holds (the rules' expressions are not compared: nftables
lists them normalised, not as we wrote them); its sets by name; every element of every set.
Each difference names the object in ``nft`` syntax.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ovsproxy.model import Protocol
from ovsproxy.steering import render
from ovsproxy.steering.desired import Element, SetKey, SteeringState
from ovsproxy.steering.table import parse_listing

MISSING, UNEXPECTED, DIFFERS = "missing", "unexpected", "differs"
_TABLE = f"{render.FAMILY} {render.TABLE}"
_BASE = ("type", "hook", "prio", "policy")


@dataclass(frozen=True, slots=True)
class TableDifference:
    """``kind`` missing/unexpected/differs; ``what`` "nftables table", "... chain", "... set"
    or "... element"; ``text`` the object in nft syntax; ``detail`` what exactly differs."""

    kind: str
    what: str
    text: str
    detail: str = ""


def chain_text(chain: dict[str, Any]) -> str:
    text = f"chain {_TABLE} {chain.get('name')}"
    if chain.get("hook") is None:
        return text
    return (
        f"{text} {{ type {chain.get('type')} hook {chain.get('hook')} "
        f"priority {chain.get('prio')}; policy {chain.get('policy')}; }}"
    )


def element_text(key: SetKey, element: Element) -> str:
    name, family = key
    parts = [p.value.lower() if isinstance(p, Protocol) else str(p) for p in element]
    return f"element {_TABLE} {render.set_name(name, family)} {{ {' . '.join(parts)} }}"


def _skeleton() -> tuple[dict[str, dict[str, Any]], collections.Counter[str], set[str]]:
    chains: dict[str, dict[str, Any]] = {}
    rules: collections.Counter[str] = collections.Counter()
    sets: set[str] = set()
    for command in render.skeleton():
        body = command.get("add", {})
        if "chain" in body:
            chains[body["chain"]["name"]] = body["chain"]
        elif "rule" in body:
            rules[body["rule"]["chain"]] += 1
        elif "set" in body:
            sets.add(body["set"]["name"])
    return chains, rules, sets


def _base(chain: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(chain.get(k)) for k in _BASE)


def compare_table(listing: dict[str, Any] | None, desired: SteeringState) -> list[TableDifference]:
    """Every difference between a ``list table inet ovsproxy`` JSON answer (None: the table
    is absent) and the table holding ``desired``: table, chains, sets, then elements."""
    if listing is None:
        return [
            TableDifference(
                MISSING,
                "nftables table",
                f"table {_TABLE}",
                f"its chains and {desired.size} element(s) are wanted",
            )
        ]
    items = listing.get("nftables", [])
    have_chains = {i["chain"]["name"]: i["chain"] for i in items if "chain" in i}
    have_rules = collections.Counter(i["rule"]["chain"] for i in items if "rule" in i)
    have_sets = {i["set"]["name"] for i in items if "set" in i}
    want_chains, want_rules, want_sets = _skeleton()
    diffs: list[TableDifference] = []
    for name, want in want_chains.items():
        have = have_chains.get(name)
        if have is None:
            diffs.append(TableDifference(MISSING, "nftables chain", chain_text(want)))
        elif _base(have) != _base(want):
            diffs.append(
                TableDifference(
                    DIFFERS, "nftables chain", chain_text(have), f"wanted {chain_text(want)}"
                )
            )
        elif have_rules[name] != want_rules[name]:
            diffs.append(
                TableDifference(
                    DIFFERS,
                    "nftables chain",
                    chain_text(have),
                    f"{have_rules[name]} rule(s), wanted {want_rules[name]}",
                )
            )
    for name in sorted(have_chains.keys() - want_chains.keys()):
        diffs.append(TableDifference(UNEXPECTED, "nftables chain", chain_text(have_chains[name])))
    for name in sorted(want_sets - have_sets):
        diffs.append(TableDifference(MISSING, "nftables set", f"set {_TABLE} {name}"))
    for name in sorted(have_sets - want_sets):
        diffs.append(TableDifference(UNEXPECTED, "nftables set", f"set {_TABLE} {name}"))
    diffs += _element_differences(parse_listing(listing), desired, have_sets)
    return diffs


def _element_differences(
    installed: SteeringState, desired: SteeringState, present_sets: Iterable[str]
) -> list[TableDifference]:
    present = set(present_sets)
    diffs: list[TableDifference] = []
    keys = sorted(
        installed.sets.keys() | desired.sets.keys(), key=lambda k: render.set_name(k[0], k[1])
    )
    for key in keys:
        if render.set_name(*key) not in present:
            continue  # the set itself is reported missing
        want = desired.sets.get(key, frozenset())
        have = installed.sets.get(key, frozenset())
        for kind, elements in ((MISSING, want - have), (UNEXPECTED, have - want)):
            for element in sorted(elements, key=str):
                diffs.append(TableDifference(kind, "nftables element", element_text(key, element)))
    return diffs

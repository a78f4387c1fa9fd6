"""Helpers that use ``ovs-ofctl`` as an oracle (encoder from text, decoder to text)."""

from __future__ import annotations

import re
import shutil
import subprocess

OVS_OFCTL = shutil.which("ovs-ofctl")

_HEX_LINE = re.compile(r"^[0-9a-f]{8}  ((?:[0-9a-f]{2}[ -]){1,16})")


def _run(*args: str) -> str:
    result = subprocess.run([OVS_OFCTL, *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise AssertionError(f"ovs-ofctl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def _hex_dump(output: str) -> bytes:
    data = bytearray()
    for line in output.splitlines():
        m = _HEX_LINE.match(line)
        if m:
            data += bytes.fromhex(m.group(1).replace("-", " ").replace(" ", ""))
    return bytes(data)


def encode_flow(text: str) -> bytes:
    """The OpenFlow 1.5 FLOW_MOD that ``ovs-ofctl`` builds for an add-flow string (xid 1)."""
    return _hex_dump(_run("-O", "OpenFlow15", "-mmmmm", "parse-flow", text))


def encode_group(text: str) -> bytes:
    """The OpenFlow 1.5 GROUP_MOD that ``ovs-ofctl`` builds for an add-group string."""
    return _hex_dump(_run("-O", "OpenFlow15", "-mmmmm", "parse-group", text))


def ofp_print(data: bytes) -> str:
    """``ovs-ofctl ofp-print`` of the message, without trailing whitespace."""
    return _run("ofp-print", data.hex()).rstrip()

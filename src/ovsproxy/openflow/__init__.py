"""OpenFlow 1.5 for Open vSwitch.

* ``ovsproxy.openflow.protocol`` (``from ovsproxy.openflow import protocol as of``): the
  sans-I/O codec — frozen values (matches, actions, flows, groups, bundles...) that carry
  their encoding, ``encode``/``decode``/``Parser``, and ``ovs-ofctl`` text;
* ``ovsproxy.openflow.connection``: the asyncio ``Channel`` (handshake, xid futures,
  bundles, keepalive, reconnection with an ``on_connected`` replay hook, counters).
"""

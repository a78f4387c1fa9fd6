"""OpenFlow 1.5 for Open vSwitch.

* ``ovsproxy.openflow.protocol`` (``from ovsproxy.openflow import protocol as of``): the
  sans-I/O codec — frozen values (matches, actions, flows, groups, bundles...) that carry
  their encoding, ``encode``/``decode``/``Parser``, and ``ovs-ofctl`` text;
* ``ovsproxy.openflow.session``: one connection's protocol as a sans-I/O state machine
  (handshake and version negotiation, xid matching, multipart reassembly, bundle error
  attribution, keepalive and timeout decisions from a time passed in);
* ``ovsproxy.openflow.connection``: the asyncio ``Channel`` driving a session (sockets,
  timers, futures, reconnection with an ``on_connected`` replay hook);
* ``ovsproxy.openflow.errors``: the channel's exceptions; ``ovsproxy.openflow.counters``:
  its wire counters.
"""

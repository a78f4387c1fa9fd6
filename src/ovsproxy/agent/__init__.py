"""The agent: one run of ovsproxy, from configuration to shutdown.

One job per module: ``logs`` (logging set-up), ``wiring`` (components built from the config:
source, route backend, channel, datapath, proxier), ``sync`` (the sync wrapper: drift repair,
health, metrics, the first route reconcile), ``pods`` (pod polling), ``observability``
(metrics registration, /status, /dump), ``embedded`` (the default sandbox, example lab and
banner) and ``lifecycle`` (start-up order, run, shutdown, cleanup: ``Agent``).
"""

from ovsproxy.agent.lifecycle import Agent
from ovsproxy.agent.logs import setup_logging

__all__ = ["Agent", "setup_logging"]

"""kube-proxy's health checks: the proxy's /healthz and /livez state, and the per-Service
healthCheckNodePort servers."""

from ovsproxy.healthcheck.proxy_health import TO_BE_DELETED_TAINT, ProxyHealth
from ovsproxy.healthcheck.service_health import (
    WEIGHT_HEADER,
    ServiceHealth,
    ServiceHealthServers,
    UpdateResult,
    desired_health_checks,
)

__all__ = [
    "TO_BE_DELETED_TAINT",
    "WEIGHT_HEADER",
    "ProxyHealth",
    "ServiceHealth",
    "ServiceHealthServers",
    "UpdateResult",
    "desired_health_checks",
]

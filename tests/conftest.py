"""Shared fixtures. Live tests use a real private OVS sandbox (see ovsproxy.ovs.sandbox)."""

from __future__ import annotations

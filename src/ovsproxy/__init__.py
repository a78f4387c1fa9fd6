"""ovsproxy: a Kubernetes Service proxy for Open vSwitch."""

__version__ = "0.1.0"

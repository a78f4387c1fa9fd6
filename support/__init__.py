"""What tests and benchmarks share, so that neither imports the other (tests/test_layers.py):
the fake Kubernetes API server (``k8s_fake``), the conformance tests' control plane over it
(``apiserver``) and a cluster's objects as the API server or a manifest holds them
(``cluster``). Not part of the product: nothing in src imports it."""

"""A TEST FAKE of the Kubernetes API server (list/watch/bookmarks/410), for tests only."""

from support.k8s_fake.server import FakeKubeApi

__all__ = ["FakeKubeApi"]

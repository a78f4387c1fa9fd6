"""The memory policy around a sync of the datapath, and around its replay after a
reconnection: ``memory_policy``, the one place the cyclic garbage collector and the heap are
handled for them (the agent's sync, ``agent.sync``, and its channel hook, ``agent.wiring``;
the benches measure the same). The datapath's commit itself touches neither.

A full sync builds over a million long-lived, acyclic values (flows, buckets, their matches
and actions; CPython never untracks tuple subclasses), and every collection of the cyclic
collector would traverse them again (most of a 10,000-Service sync with the default
thresholds, and every full collection afterwards; bench ``full-sync`` reports the time still
spent in the collector). So around a sync:

* the cyclic collector is paused (``gcpause.gc_paused``: the proxier stages every changed
  Service, then awaits the commit);
* when the sync's commits touched more than ``BIG_COMMIT`` groups and flows and it succeeded,
  everything alive is moved to the permanent generation (``gc.freeze()``, with
  ``SwitchSync.freeze_gc``, the default) before the collector resumes: the new state is never
  traversed again. Reference counting still frees whatever becomes garbage later; only
  reference cycles that exist at that moment (and cycles through frozen objects) are never
  collected, which for this state (acyclic values in dicts) is nothing (``gcpause.compact``
  finds those at a periodic full resync);
* and then, with the commit's transient values gone, the heap's free pages go back to the OS
  (``heap.release_free_memory``: glibc keeps them otherwise).

Small syncs (churn) only pause the collector; the agent's ``Syncer`` settles it after every
sync (``gcpause.settle``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from ovsproxy.datapath.switch_sync import SwitchSync
from ovsproxy.gcpause import gc_paused
from ovsproxy.heap import release_free_memory

# A sync whose commits touched more groups + flows than this is followed by a freeze and a
# release of the heap's free pages.
BIG_COMMIT = 5000


@contextlib.contextmanager
def memory_policy(datapath: SwitchSync) -> Iterator[None]:
    """Run a sync (or a replay) of ``datapath`` under the policy above."""
    touched = datapath.touched
    with gc_paused():
        yield
        big = datapath.touched - touched > BIG_COMMIT
        if big and datapath.freeze_gc:
            gc.freeze()  # the collector is paused here: nothing young is traversed first
    if big:
        release_free_memory()

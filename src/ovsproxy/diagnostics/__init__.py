"""Read-side diagnostics of the switch: what it holds against what a fresh agent would install
(``compare``), and its own packet trace read through our pipeline (``trace``). Pure; used by
``ovsproxy trace``, ``verify`` and the benches."""

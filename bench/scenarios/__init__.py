"""One module per scenario. Each defines ``NAME``, ``DESCRIPTION`` and
``run(quick: bool) -> dict``; the dict holds the scenario's figures (JSON-serialisable),
including the ratios against the baseline measured in the same run."""

"""Runs and the units of work the flows compose: run records and state, locks, progress, the
models a workspace knows, and one module per unit (pinned inputs, ingest, HPSv3, judges,
aggregate, discovery)."""

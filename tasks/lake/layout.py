"""The lake's file layout, shared by its writer (tables.py), its compaction and its start check:
``<lake>/<table>/model_id=<id>/data.parquet``."""

DATA_FILE = "data.parquet"
PARTITION_PREFIX = "model_id="

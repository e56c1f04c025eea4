"""The results lake: per-model Parquet tables, their compaction, the DuckDB catalog's views,
Great Expectations validation, bulk imports and the report's lake reader."""

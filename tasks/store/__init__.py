"""The object store and what comes in from it: storage, ingest, demo data, small input files,
the durable local writes everything shares, and the redaction that keeps credentials out of
everything written."""

"""The human-panel web app (issue 9): blinding, the answer store, the FastAPI app."""

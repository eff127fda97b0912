"""Training-side client (work in progress: the API lands in supervisor/client/api.py)."""

"""The job queue in the database: its order (order.py), the workers' claims on it (claim.py) and why a
job waits (waiting.py)."""

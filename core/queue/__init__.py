"""The job queue in the database: its order (order.py) and the workers' claims on it (claim.py)."""

"""Prefect flows: each only chains the tasks in `tasks/`."""

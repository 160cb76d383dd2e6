"""The scheduler process: ``python -m scheduler``. Any number may run."""

"""What the processes tell their operators: Sentry and logging set-up
(:mod:`.sentry`) and the Prometheus metrics (:mod:`.metrics`, whose
database gauges read through the store).

It imports the store, the domain and the shared kernel.
"""

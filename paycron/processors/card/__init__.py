"""The fake card processor's API (the ``gateway`` process), over urllib3,
and its settlement report as CSV."""

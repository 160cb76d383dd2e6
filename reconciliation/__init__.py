"""Daily reconciliation: the gateway's settlement report against our attempts."""

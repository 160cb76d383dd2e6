"""Stripe through its official SDK: the adapter (:mod:`.client`), the SDK's
HTTP transport over urllib3 (:mod:`.transport`) and Stripe's amount rules
(:mod:`.amounts`)."""

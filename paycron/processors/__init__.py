"""The processors paycron charges through.

:mod:`.base` is the interface the engine sees; each processor is one
sub-package that implements it (:mod:`.card`, the fake card processor's
API; :mod:`.stripe`, Stripe through its official SDK) with its wire
format, its answer table and its own rules; :mod:`.factory` picks one for
a composition root. Adding a processor adds a sub-package and one line in
the factory.

A processor imports the domain, :mod:`.base`, the limits (the shared call
window) and the shared kernel; never the store or the engine, and never
another processor.
"""

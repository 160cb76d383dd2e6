"""Dev tools, not the product: launching paycron's processes from Python
(the Procfile's commands), ``paycron demo``, the fake gateway's test controls,
and the row factories and figures the tests and the benchmarks share.

Nothing in ``paycron/`` or the parts imports this package; its third-party
dependencies come with the ``demo`` and ``dev`` extras."""

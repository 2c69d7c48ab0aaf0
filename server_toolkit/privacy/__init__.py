"""Client-level differential privacy (DP-FedAvg), label-histogram noise and robust
aggregation for the round loop (``docs/privacy.md``).

``settings`` (what the user asked, checked per method), ``windows`` (which methods average
sub-model windows, and each update's window), ``clipping`` (the private aggregate),
``adaptive`` (quantile clipping), ``accountant`` (epsilon from ``dp-accounting``),
``round_privacy`` (what the round loop calls).
"""

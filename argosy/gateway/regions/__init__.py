"""One gateway per region, each knowing the others (docs/regions.md): state exchange (exchange.py), outlier
detection with hold-down and ramp (outlier.py), regions as routing candidates (upstream.py, service.py),
signed gateway-to-gateway calls (auth.py), forwarding (forwarding.py), endpoints and metrics."""

"""The gateway: the front door users talk to (routing, admission, keys, limits, guardrails, metrics).

It holds no request state beyond the streams in flight, so several can run side by side (with
`gateway.redis_url`, they share limits, counters, the prefix index and in-flight counts).
"""

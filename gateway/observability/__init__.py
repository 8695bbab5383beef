"""What the gateway tells about itself: metrics, counters, the access log
and its writer thread, loop lag, tracing, Triton-style statistics. Each
request's record (gateway/core/record.py) is core: the canonical request
context carries it.
"""

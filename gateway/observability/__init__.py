"""What the gateway tells about itself: the request record, metrics, counters,
the access log and its writer thread, loop lag, tracing, Triton-style
statistics.
"""

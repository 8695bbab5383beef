"""What a worker's listeners and clients share at run time: services, the
memory budget, the offload pool, credentials, TLS, file-descriptor limits.
"""

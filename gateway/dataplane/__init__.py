"""The data plane: routes, clusters, attempts and retries, mirrors, batching,
affinity; speaks only canonical types.
"""

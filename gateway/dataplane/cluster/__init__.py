"""Clusters (the config's upstreams): endpoints, load balancing, health checks,
outlier ejection, limits, endpoint discovery by DNS.
"""

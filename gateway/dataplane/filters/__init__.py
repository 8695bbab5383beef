"""The filter chain of the request cycle (base.py) and the filters a policy can name (registry.py)."""

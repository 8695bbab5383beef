"""The core: canonical types, errors, tensor data and the small pure helpers
every layer shares. Imports nothing above it.
"""

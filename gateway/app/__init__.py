"""The application: the composition root (server.py), the admin listener, the
supervisor of workers, the command line.
"""

"""Real peers that tests start as separate processes (one module per peer)."""

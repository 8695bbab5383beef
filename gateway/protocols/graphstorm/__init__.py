"""GraphStorm real-time inference (gs-realtime-v0.1): listener, upstream
client, and the graph tensor contract for GNN models on V2 servers."""

"""A probe host that imports torch once and forks the gate's probes from it (server.py, client.py)."""

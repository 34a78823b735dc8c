"""Helpers shared by every test tier: manifests, polling, processes, import contracts."""

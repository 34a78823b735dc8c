"""The imperative shell: kopf wiring and a thin Kubernetes client adapter. No rules live here."""

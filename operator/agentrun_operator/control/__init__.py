"""The loop-control contract between an iteration's pod and the operator.

`envelope` holds the pure data model and parsing rules (imported by the planner and the reporter);
`reporter` is the tiny program that runs in every iteration pod. Nothing here imports kopf or a
Kubernetes client, so the reporter starts quickly.
"""

"""The operator outlives an API server restart: kopf retries a failed API request (a watch
included) with our delays before it gives up, and a watch that gives up stops the operator."""

from __future__ import annotations

import inspect

from agentrun_devcluster.controlplane import ControlPlane
from agentrun_operator.shell.handlers import API_ERROR_BACKOFFS


def test_api_errors_are_retried_for_longer_than_an_api_server_may_take_to_start() -> None:
    start_timeout = inspect.signature(ControlPlane.start).parameters["timeout"].default
    assert sum(API_ERROR_BACKOFFS) > start_timeout
    assert max(API_ERROR_BACKOFFS) <= 30, "no attempt waits longer than 30 s once the server is back"
    assert list(API_ERROR_BACKOFFS) == sorted(API_ERROR_BACKOFFS), "backing off, never hurrying up"

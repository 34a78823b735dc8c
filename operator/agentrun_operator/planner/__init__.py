"""The functional core: pure planning of AgentRun reconciliation (SPEC §4). No I/O lives here."""

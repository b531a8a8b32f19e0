"""Processes that tests start and SIGKILL mid-delivery
(``python -m tests.support.children.<name>``)."""

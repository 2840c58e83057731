"""The router rig of tests/test_router_e2e.py: :mod:`capcal_integrations.testing.router`, re-exported."""

from capcal_integrations.testing.router import Rig, Seen, free_port, router_binary  # noqa: F401 - re-exported

"""The node agent (one process per node): runs a cluster's jobs with SkyPilot's env contract.

Start it with `python -m skypurza.services.agent <AgentSpec argv>` (see events/agentspec.py).
"""

"""The API server's core (open): identity, authorization, and the REST API in front of the bus.

docs/team.md says what exists and how to run it; `python -m skypurza.services.api --help`.
"""

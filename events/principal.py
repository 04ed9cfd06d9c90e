"""Who published an event: the caller an API server authenticated, stamped on the envelope.

The stamp is two CloudEvents extension attributes (`spzuser`, `spzteam`, names from
events/identity_events.py). Only the API server writes them, after authenticating the caller;
readers that attribute work to a user or team (the ledger, later dispatch) prefer the stamp to
anything the task or the event's own fields claim. An event published on the embedded bus has
no stamp: its principal is the OS user the CLI ran as (the event's `user` field).
"""

from __future__ import annotations

from .envelope import Envelope
from .identity_events import EXT_TEAM, EXT_USER


def stamp(env: Envelope, user: str, team: str) -> Envelope:
    """`env` with the authenticated caller as CloudEvents extension attributes."""
    return Envelope.model_validate({**env.model_dump(), EXT_USER: user, EXT_TEAM: team})


def stamped_principal(env: Envelope) -> tuple[str, str] | None:
    """(user, team) an API server stamped on `env`, or None (published on the embedded bus)."""
    extra = env.model_extra or {}
    user, team = extra.get(EXT_USER), extra.get(EXT_TEAM)
    if isinstance(user, str) and isinstance(team, str):
        return user, team
    return None


def principal_of(env: Envelope | None, event: object) -> tuple[str, str | None]:
    """Who owns what `event` started (a TaskSubmitted, a ManagedJobSubmitted): the stamp when an
    API server published it, else the event's own `user` and `team` (the embedded bus)."""
    stamped = stamped_principal(env) if env is not None else None
    if stamped is not None:
        return stamped
    return str(getattr(event, "user", "") or ""), getattr(event, "team", None)

"""Import point for every event model: importing this fills the type registry."""

from .cluster_events import *  # noqa: F401,F403
from .envelope import REGISTRY, Envelope, Event, decode, derive_id, make_envelope  # noqa: F401
from .job_events import *  # noqa: F401,F403
from .ledger_events import *  # noqa: F401,F403
from .managed_events import *  # noqa: F401,F403
from .task_events import *  # noqa: F401,F403
from .types import Attempt, Candidate, NodeInfo  # noqa: F401


def all_event_types() -> list[type[Event]]:
    return sorted(REGISTRY.values(), key=lambda c: (c.AGGREGATE, c.EVENT_NAME))

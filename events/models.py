"""Import point for every event model: importing this fills the type registry.

Below `envelope.py` (which imports this to decode): nothing here imports the envelope.
"""

from .alert_events import AlertDelivered, AlertDeliveryClaimed, AlertRaised, AlertResolved  # noqa: F401
from .cluster_events import *  # noqa: F401,F403
from .dispatch_events import DispatchPolicyApplied, TaskAdmitted, TaskHeld  # noqa: F401
from .health_events import GpuUnhealthy  # noqa: F401
from .identity_events import (  # noqa: F401
    TeamAdded, TeamRemoved, TeamUpdated, TokenIssued, TokenRevoked, UserAdded, UserJoinedTeam, UserLeftTeam, UserRemoved,
    UserTeamRoleSet,
)
from .job_events import *  # noqa: F401,F403
from .ledger_events import *  # noqa: F401,F403
from .managed_events import *  # noqa: F401,F403
from .registry import REGISTRY, Event  # noqa: F401
from .task_events import *  # noqa: F401,F403
from .types import Attempt, Candidate, NodeInfo  # noqa: F401


def all_event_types() -> list[type[Event]]:
    return sorted(REGISTRY.values(), key=lambda c: (c.AGGREGATE, c.EVENT_NAME))

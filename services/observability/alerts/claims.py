"""Who posts a message when several alerts instances run (pure; the service does the I/O).

Two instances judging the same round both raise the same alert (one AlertRaised is stored: its
id is derived) and both would post it. Before posting, an instance appends an
AlertDeliveryClaimed whose id is derived from the message, the webhook and the claim's round: the
log stores the first, and JetStream answers the others' appends as duplicates. The instance
whose append was stored posts; the others wait, and each round of the rules looks again:

- an AlertDelivered for the message: done;
- a claim of this instance (an append whose ack was lost and came back as a duplicate, seen
  now on the log): post it;
- another's claim, still within its `until`: wait;
- another's claim past its `until` with nothing delivered (that instance stopped or lost the
  bus mid-delivery): claim the next round.

`until` is the claim's time plus the longest a delivery can take (delivery.longest_s) and a
margin for clocks, so a live instance's slow retries are never taken over; a stopped one's
message is posted by another, late, but never lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from . import delivery
from .settings import AlertSettings

# key, occurrence, what ("raised" | "resolved"), webhook id
MessageKey = tuple[str, int, str, str]

CLOCK_MARGIN_S = 30.0  # instances on other hosts: their clocks may differ this much
# The longest any claim holds, whatever its `until` says: past the longest delivery the settings'
# bounds allow (20 attempts of 60 s, back-offs capped at 300 s: ~2 h), so that a bogus `until` (a
# clock years ahead) holds its message for hours, not for ever.
MAX_CLAIM_S = 3 * 3600.0

Step = Literal["done", "deliver", "claim", "wait"]


@dataclass(frozen=True)
class Claim:
    claimant: str
    round: int
    until: datetime


def claim_of(claimant: str, round_: int, at: datetime, until: datetime) -> Claim:
    """A claim as the log states it, its hold bounded by MAX_CLAIM_S from when it was made."""
    return Claim(claimant, round_, min(until, at + timedelta(seconds=MAX_CLAIM_S)))


def next_step(claim: Claim | None, delivered: bool, me: str, now: datetime) -> tuple[Step, int]:
    """What instance `me` does about one message now, and the claim round that goes with it."""
    if delivered:
        return "done", 0
    if claim is None:
        return "claim", 1
    if claim.claimant == me:
        return "deliver", claim.round
    if now < claim.until:
        return "wait", claim.round
    return "claim", claim.round + 1


def fold(claims: dict[MessageKey, Claim], k: MessageKey, claim: Claim) -> None:
    """The log's claim for `k`: the highest round; of one round, the first stored."""
    held = claims.get(k)
    if held is None or claim.round > held.round:
        claims[k] = claim


def lease(settings: AlertSettings, now: datetime) -> datetime:
    """When a claim made `now` lapses."""
    return now + timedelta(seconds=delivery.longest_s(settings.attempts, settings.backoff_s, settings.timeout_s)
                           + CLOCK_MARGIN_S)

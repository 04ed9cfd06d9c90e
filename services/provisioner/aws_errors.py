"""Classify AWS EC2 error codes: what failed, how wide, and whether a retry can help.

SkyPilot 0.14.1 treats every EC2 ClientError but a handful of transient codes alike (it
blocks the zones it tried and moves on). We keep AWS's own code and message and sort them:

- capacity (zone): AWS has no hardware of this type in this zone right now. Try the next zone.
- spot capacity (zone): no spot capacity, or the market price is above our maximum. The same
  zone may still have on-demand capacity.
- quota (region): an account limit (vCPUs per instance family, spot requests, volumes) in this
  region. Other regions have their own limits.
- unsupported: the type, image or option is not offered in this zone or region.
- auth (fatal): credentials or permissions; the hint says what to do.
- transient: throttling and AWS-side faults; retried in place with back-off (see aws_retry).
- invalid (fatal): our request is wrong (bad parameter, idempotency token reused with other
  parameters); retrying or failing over cannot help.
- not implemented: the endpoint does not offer the operation at all (a local AWS emulator such
  as a bare `moto_server` answers an action it lacks with an HTML "500 Internal Server Error"
  page; AWS itself says InvalidAction or NotImplemented). Classified unsupported for the
  request, never retried: asking again cannot make the operation exist.

Pure functions only; aws_retry and the adapter call them.
"""

from __future__ import annotations

from .adapter import Failure, FailureKind, FailureScope

K, S = FailureKind, FailureScope

NOT_IMPLEMENTED = "NotImplemented"  # our code for an operation the endpoint does not offer
_NOT_IMPLEMENTED_HINT = "the EC2 endpoint does not implement this operation (a local AWS emulator?)"
_NOT_IMPLEMENTED_CODES = frozenset({NOT_IMPLEMENTED, "InvalidAction"})

# code -> (kind, scope, hint). A kind of CAPACITY becomes SPOT_CAPACITY for spot requests.
_TABLE: dict[str, tuple[FailureKind, FailureScope, str]] = {
    # No hardware for this request in this zone (AWS sends most of these with HTTP 500).
    "InsufficientInstanceCapacity": (K.CAPACITY, S.ZONE, ""),
    "InsufficientCapacity": (K.CAPACITY, S.ZONE, ""),
    "InsufficientHostCapacity": (K.CAPACITY, S.ZONE, ""),
    "InsufficientCapacityOnHost": (K.CAPACITY, S.ZONE, ""),
    "InsufficientReservedInstanceCapacity": (K.CAPACITY, S.ZONE, ""),
    "InsufficientAddressCapacity": (K.CAPACITY, S.ZONE, ""),
    "InsufficientVolumeCapacity": (K.CAPACITY, S.ZONE, ""),
    "InsufficientFreeAddressesInSubnet": (
        K.CAPACITY, S.ZONE, "the subnet has no free IP addresses left; use a larger subnet",
    ),
    "ReservationCapacityExceeded": (K.CAPACITY, S.ZONE, ""),
    # Spot market.
    "SpotMaxPriceTooLow": (K.SPOT_CAPACITY, S.ZONE, "the spot price is above the maximum price"),
    "MaxSpotInstanceCountExceeded": (
        K.QUOTA, S.REGION, "raise the spot instance quota for this region (Service Quotas)",
    ),
    "MaxSpotFleetRequestCountExceeded": (K.QUOTA, S.REGION, "raise the spot fleet request quota"),
    # Account limits, per region.
    "VcpuLimitExceeded": (
        K.QUOTA, S.REGION,
        "raise the vCPU quota for this instance family in this region (Service Quotas)",
    ),
    "InstanceLimitExceeded": (K.QUOTA, S.REGION, "raise the instance limit in this region"),
    "VolumeLimitExceeded": (K.QUOTA, S.REGION, "raise the EBS storage quota in this region"),
    "MaxIOPSLimitExceeded": (K.QUOTA, S.REGION, "raise the EBS IOPS quota in this region"),
    "ResourceLimitExceeded": (K.QUOTA, S.REGION, ""),
    "SecurityGroupLimitExceeded": (K.QUOTA, S.REGION, "delete unused security groups"),
    "PlacementGroupLimitExceeded": (K.QUOTA, S.REGION, "delete unused placement groups"),
    "AddressLimitExceeded": (K.QUOTA, S.REGION, "release unused Elastic IP addresses"),
    "NetworkInterfaceLimitExceeded": (K.QUOTA, S.REGION, ""),
    "KeyPairLimitExceeded": (K.QUOTA, S.REGION, "delete unused key pairs"),
    "MaxConfigLimitExceeded": (K.QUOTA, S.REGION, ""),
    # Not offered here.
    "Unsupported": (K.UNSUPPORTED, S.ZONE, ""),
    "UnsupportedOperation": (K.UNSUPPORTED, S.REQUEST, ""),
    "UnsupportedInstanceAttribute": (K.UNSUPPORTED, S.REQUEST, ""),
    "InvalidInstanceType": (K.UNSUPPORTED, S.REGION, ""),
    "InvalidInstanceType.NotFound": (K.UNSUPPORTED, S.REGION, ""),
    "InvalidAMIID.NotFound": (K.UNSUPPORTED, S.REGION, "AMI ids are per region: give image_id per region"),
    "InvalidAMIID.Unavailable": (K.UNSUPPORTED, S.REGION, ""),
    "InvalidAMIID.Malformed": (K.INVALID, S.REQUEST, ""),
    "AvailabilityZoneNotFromRegionError": (K.UNSUPPORTED, S.ZONE, ""),
    "InvalidPlacementGroup.Unknown": (K.INVALID, S.REQUEST, ""),
    "InvalidPlacementGroup.InUse": (K.TRANSIENT, S.REQUEST, ""),
    # Auth and permissions: nothing else will work either.
    "AuthFailure": (K.AUTH, S.CLOUD, "AWS could not validate the credentials: check `aws sts get-caller-identity`"),
    "UnauthorizedOperation": (
        K.AUTH, S.CLOUD,
        "the AWS identity lacks an EC2 permission; decode the message with "
        "`aws sts decode-authorization-message` and grant it in IAM",
    ),
    "AccessDenied": (K.AUTH, S.CLOUD, "the AWS identity is not allowed this action: check its IAM policy"),
    "InvalidClientTokenId": (K.AUTH, S.CLOUD, "the access key id does not exist: check the credentials"),
    "SignatureDoesNotMatch": (K.AUTH, S.CLOUD, "the secret access key is wrong: check the credentials"),
    "ExpiredToken": (K.AUTH, S.CLOUD, "the session token expired: refresh the credentials (e.g. `aws sso login`)"),
    "RequestExpired": (K.AUTH, S.CLOUD, "the request signature expired: check this machine's clock"),
    "MissingAuthenticationToken": (K.AUTH, S.CLOUD, "no AWS credentials found: configure them"),
    "Blocked": (K.AUTH, S.CLOUD, "the AWS account is blocked: contact AWS Support"),
    "PendingVerification": (K.AUTH, S.REGION, "the account is pending verification for this region"),
    "OptInRequired": (K.AUTH, S.REGION, "enable this region (opt-in) in the AWS account settings"),
    # Throttling and AWS-side faults: retry the same request.
    "RequestLimitExceeded": (K.TRANSIENT, S.REQUEST, ""),
    "Throttling": (K.TRANSIENT, S.REQUEST, ""),
    "ThrottlingException": (K.TRANSIENT, S.REQUEST, ""),
    "EC2ThrottledException": (K.TRANSIENT, S.REQUEST, ""),
    "RequestThrottled": (K.TRANSIENT, S.REQUEST, ""),
    "InternalError": (K.TRANSIENT, S.REQUEST, ""),
    "InternalFailure": (K.TRANSIENT, S.REQUEST, ""),
    "ServerInternal": (K.TRANSIENT, S.REQUEST, ""),
    "ServiceUnavailable": (K.TRANSIENT, S.REQUEST, ""),
    "Unavailable": (K.TRANSIENT, S.REQUEST, ""),
    "RequestTimeout": (K.TRANSIENT, S.REQUEST, ""),
    "RequestTimeoutException": (K.TRANSIENT, S.REQUEST, ""),
    "PriorRequestNotComplete": (K.TRANSIENT, S.REQUEST, ""),
    "IncorrectState": (K.TRANSIENT, S.REQUEST, ""),
    "IncorrectInstanceState": (K.TRANSIENT, S.REQUEST, ""),
    "DependencyViolation": (K.TRANSIENT, S.REQUEST, ""),
    # Our request is wrong.
    "IdempotentParameterMismatch": (
        K.INVALID, S.REQUEST, "a launch token was reused with different parameters",
    ),
    "InvalidParameterValue": (K.INVALID, S.REQUEST, ""),
    "InvalidParameterCombination": (K.INVALID, S.REQUEST, ""),
    "InvalidParameter": (K.INVALID, S.REQUEST, ""),
    "MissingParameter": (K.INVALID, S.REQUEST, ""),
    "InvalidUserData.Malformed": (K.INVALID, S.REQUEST, ""),
    "InvalidBlockDeviceMapping": (K.INVALID, S.REQUEST, ""),
    "InvalidKeyPair.NotFound": (K.INVALID, S.REQUEST, ""),
    "InvalidGroup.NotFound": (K.INVALID, S.REQUEST, ""),
    "InvalidSubnetID.NotFound": (K.INVALID, S.REQUEST, ""),
    "VPCIdNotSpecified": (
        K.INVALID, S.REGION, "the region has no default VPC: create one (`aws ec2 create-default-vpc`)",
    ),
    # The endpoint does not offer the operation (AWS's own codes; emulators: see classify_unparsed).
    "NotImplemented": (K.UNSUPPORTED, S.REQUEST, _NOT_IMPLEMENTED_HINT),
    "InvalidAction": (K.UNSUPPORTED, S.REQUEST, _NOT_IMPLEMENTED_HINT),
}

# Instance state-reason codes (DescribeInstances StateReason.Code) of a node that died on its
# own: AWS could not keep or start it.
_STATE_REASONS: dict[str, tuple[FailureKind, FailureScope, str]] = {
    "Server.SpotInstanceTermination": (K.SPOT_CAPACITY, S.ZONE, ""),
    "Server.SpotInstanceShutdown": (K.SPOT_CAPACITY, S.ZONE, ""),
    "Server.InsufficientInstanceCapacity": (K.CAPACITY, S.ZONE, ""),
    "Server.InternalError": (K.TRANSIENT, S.REQUEST, ""),
    "Server.ScheduledStop": (K.TRANSIENT, S.REQUEST, ""),
    "Client.VolumeLimitExceeded": (K.QUOTA, S.REGION, "raise the EBS storage quota in this region"),
    "Client.InternalError": (K.INVALID, S.REQUEST, "the image or volume configuration does not boot"),
    "Client.InvalidSnapshot.NotFound": (K.UNSUPPORTED, S.REGION, ""),
}

def known_codes() -> frozenset[str]:
    return frozenset(_TABLE)


def known_state_reasons() -> frozenset[str]:
    return frozenset(_STATE_REASONS)


def classify(
    code: str,
    message: str = "",
    *,
    http_status: int | None = None,
    use_spot: bool = False,
) -> Failure:
    """Classify one EC2 API error (code and message exactly as AWS sent them)."""
    entry = _TABLE.get(code) or _by_family(code, message, http_status)
    kind, scope, hint = entry
    if kind is K.CAPACITY and use_spot:
        kind = K.SPOT_CAPACITY
    if code == "Unsupported" and _mentions_spot(message) and use_spot:
        kind, scope = K.SPOT_CAPACITY, S.ZONE
    if code == "InvalidParameterValue" and "instance type" in message.lower().replace("instancetype", "instance type"):
        # AWS's answer to a type this region does not have: the optimizer's catalog is stale.
        kind, scope = K.UNSUPPORTED, S.REGION
    return Failure(kind=kind, scope=scope, code=code, message=message, hint=hint)


def classify_state_reason(code: str | None, message: str = "", *, use_spot: bool = False) -> Failure | None:
    """Classify why a node died by itself (StateReason), or None for a normal user action."""
    if not code or code.startswith("Client.UserInitiated") or code == "Client.InstanceInitiatedShutdown":
        return None
    entry = _STATE_REASONS.get(code)
    if entry is None:
        entry = (K.UNKNOWN, S.ZONE, "") if code.startswith("Server.") else (K.INVALID, S.REQUEST, "")
    kind, scope, hint = entry
    if kind is K.CAPACITY and use_spot:
        kind = K.SPOT_CAPACITY
    return Failure(kind=kind, scope=scope, code=code, message=message or code, hint=hint)


def not_implemented(failure: Failure) -> bool:
    """Whether the failure says the endpoint does not offer the operation at all."""
    return failure.code in _NOT_IMPLEMENTED_CODES


def classify_unparsed(text: str, *, http_status: int | None = None, emulator: bool = False) -> Failure | None:
    """An answer botocore could not parse (`text` is its error text, which quotes the body).

    A bare `moto_server` answers an action it does not implement with its web framework's HTML
    "500 Internal Server Error" page. No AWS endpoint sends HTML for an EC2 call, so from an
    endpoint that is not AWS's (`emulator`) that page means "not implemented": returned as such,
    so nobody retries it. Anything else is None (the caller keeps treating it as transient).
    """
    lowered = text.lower()
    html = "<html" in lowered or "<!doctype html" in lowered
    server_error = "500 internal server error" in lowered or http_status == 500
    if http_status == 501 or (emulator and html and server_error):
        first = text.strip().splitlines()[0] if text.strip() else ""
        return Failure(K.UNSUPPORTED, S.REQUEST, NOT_IMPLEMENTED,
                       f"the endpoint answered with an HTML server error page ({first[:200]})",
                       _NOT_IMPLEMENTED_HINT)
    return None


def should_retry(code: str | None, http_status: int | None) -> bool:
    """Whether botocore should resend this request as it is.

    Only transient failures are retried. Capacity, quota, unsupported, auth and invalid
    failures surface at once even when AWS sends them with a 5xx status, so the optimizer can
    move on within milliseconds.
    """
    if not code:
        # No parsable error: a bare 5xx from a load balancer or a truncated body (501: the
        # operation does not exist there, which no retry changes).
        return http_status is not None and http_status >= 500 and http_status != 501
    return classify(code, http_status=http_status).kind is K.TRANSIENT


def _by_family(code: str, message: str, http_status: int | None) -> tuple[FailureKind, FailureScope, str]:
    """Codes not in the table, by their shape (AWS adds new ones now and then)."""
    if code.startswith("Insufficient") and "Capacity" in code:
        return (K.CAPACITY, S.ZONE, "")
    if code.endswith("LimitExceeded") or code.endswith("QuotaExceeded"):
        return (K.QUOTA, S.REGION, "")
    if "Throttl" in code:
        return (K.TRANSIENT, S.REQUEST, "")
    if code.startswith("Unauthorized") or code.startswith("AccessDenied"):
        return (K.AUTH, S.CLOUD, "")
    if code.endswith(".NotFound") or code.endswith(".Malformed") or code.startswith("Invalid"):
        return (K.INVALID, S.REQUEST, "")
    if http_status is not None and http_status >= 500:
        return (K.TRANSIENT, S.REQUEST, "")
    return (K.UNKNOWN, S.REQUEST, "")


def _mentions_spot(message: str) -> bool:
    return "spot" in message.lower()

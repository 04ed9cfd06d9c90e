"""AWS error classification (pure) and the retry decision botocore is given."""

from __future__ import annotations

import pytest

from skypurza.services.provisioner import aws_errors
from skypurza.services.provisioner.adapter import (
    CapacityError,
    Failure,
    FailureKind as K,
    FailureScope as S,
    FatalProvisionError,
    TransientProvisionError,
    provision_error,
)

# code, HTTP status AWS sends, kind (on-demand), scope
CASES = [
    ("InsufficientInstanceCapacity", 500, K.CAPACITY, S.ZONE),
    ("InsufficientCapacity", 500, K.CAPACITY, S.ZONE),
    ("InsufficientHostCapacity", 500, K.CAPACITY, S.ZONE),
    ("InsufficientCapacityOnHost", 500, K.CAPACITY, S.ZONE),
    ("InsufficientReservedInstanceCapacity", 500, K.CAPACITY, S.ZONE),
    ("InsufficientAddressCapacity", 500, K.CAPACITY, S.ZONE),
    ("InsufficientVolumeCapacity", 500, K.CAPACITY, S.ZONE),
    ("InsufficientFreeAddressesInSubnet", 400, K.CAPACITY, S.ZONE),
    ("ReservationCapacityExceeded", 400, K.CAPACITY, S.ZONE),
    ("SpotMaxPriceTooLow", 400, K.SPOT_CAPACITY, S.ZONE),
    ("MaxSpotInstanceCountExceeded", 400, K.QUOTA, S.REGION),
    ("MaxSpotFleetRequestCountExceeded", 400, K.QUOTA, S.REGION),
    ("VcpuLimitExceeded", 400, K.QUOTA, S.REGION),
    ("InstanceLimitExceeded", 400, K.QUOTA, S.REGION),
    ("VolumeLimitExceeded", 400, K.QUOTA, S.REGION),
    ("MaxIOPSLimitExceeded", 400, K.QUOTA, S.REGION),
    ("ResourceLimitExceeded", 400, K.QUOTA, S.REGION),
    ("SecurityGroupLimitExceeded", 400, K.QUOTA, S.REGION),
    ("PlacementGroupLimitExceeded", 400, K.QUOTA, S.REGION),
    ("AddressLimitExceeded", 400, K.QUOTA, S.REGION),
    ("NetworkInterfaceLimitExceeded", 400, K.QUOTA, S.REGION),
    ("KeyPairLimitExceeded", 400, K.QUOTA, S.REGION),
    ("MaxConfigLimitExceeded", 400, K.QUOTA, S.REGION),
    ("Unsupported", 400, K.UNSUPPORTED, S.ZONE),
    ("UnsupportedOperation", 400, K.UNSUPPORTED, S.REQUEST),
    ("UnsupportedInstanceAttribute", 400, K.UNSUPPORTED, S.REQUEST),
    ("InvalidInstanceType", 400, K.UNSUPPORTED, S.REGION),
    ("InvalidInstanceType.NotFound", 400, K.UNSUPPORTED, S.REGION),
    ("InvalidAMIID.NotFound", 400, K.UNSUPPORTED, S.REGION),
    ("InvalidAMIID.Unavailable", 400, K.UNSUPPORTED, S.REGION),
    ("AvailabilityZoneNotFromRegionError", 400, K.UNSUPPORTED, S.ZONE),
    ("AuthFailure", 401, K.AUTH, S.CLOUD),
    ("UnauthorizedOperation", 403, K.AUTH, S.CLOUD),
    ("AccessDenied", 403, K.AUTH, S.CLOUD),
    ("InvalidClientTokenId", 403, K.AUTH, S.CLOUD),
    ("SignatureDoesNotMatch", 403, K.AUTH, S.CLOUD),
    ("ExpiredToken", 400, K.AUTH, S.CLOUD),
    ("RequestExpired", 400, K.AUTH, S.CLOUD),
    ("MissingAuthenticationToken", 403, K.AUTH, S.CLOUD),
    ("Blocked", 403, K.AUTH, S.CLOUD),
    ("PendingVerification", 400, K.AUTH, S.REGION),
    ("OptInRequired", 401, K.AUTH, S.REGION),
    ("RequestLimitExceeded", 503, K.TRANSIENT, S.REQUEST),
    ("Throttling", 400, K.TRANSIENT, S.REQUEST),
    ("ThrottlingException", 400, K.TRANSIENT, S.REQUEST),
    ("EC2ThrottledException", 503, K.TRANSIENT, S.REQUEST),
    ("RequestThrottled", 400, K.TRANSIENT, S.REQUEST),
    ("InternalError", 500, K.TRANSIENT, S.REQUEST),
    ("InternalFailure", 500, K.TRANSIENT, S.REQUEST),
    ("ServerInternal", 500, K.TRANSIENT, S.REQUEST),
    ("ServiceUnavailable", 503, K.TRANSIENT, S.REQUEST),
    ("Unavailable", 503, K.TRANSIENT, S.REQUEST),
    ("RequestTimeout", 400, K.TRANSIENT, S.REQUEST),
    ("RequestTimeoutException", 400, K.TRANSIENT, S.REQUEST),
    ("PriorRequestNotComplete", 400, K.TRANSIENT, S.REQUEST),
    ("IncorrectState", 400, K.TRANSIENT, S.REQUEST),
    ("IncorrectInstanceState", 400, K.TRANSIENT, S.REQUEST),
    ("DependencyViolation", 400, K.TRANSIENT, S.REQUEST),
    ("InvalidPlacementGroup.InUse", 400, K.TRANSIENT, S.REQUEST),
    ("IdempotentParameterMismatch", 400, K.INVALID, S.REQUEST),
    ("InvalidParameterValue", 400, K.INVALID, S.REQUEST),
    ("InvalidParameterCombination", 400, K.INVALID, S.REQUEST),
    ("InvalidParameter", 400, K.INVALID, S.REQUEST),
    ("MissingParameter", 400, K.INVALID, S.REQUEST),
    ("InvalidUserData.Malformed", 400, K.INVALID, S.REQUEST),
    ("InvalidBlockDeviceMapping", 400, K.INVALID, S.REQUEST),
    ("InvalidKeyPair.NotFound", 400, K.INVALID, S.REQUEST),
    ("InvalidGroup.NotFound", 400, K.INVALID, S.REQUEST),
    ("InvalidSubnetID.NotFound", 400, K.INVALID, S.REQUEST),
    ("InvalidPlacementGroup.Unknown", 400, K.INVALID, S.REQUEST),
    ("InvalidAMIID.Malformed", 400, K.INVALID, S.REQUEST),
    ("VPCIdNotSpecified", 400, K.INVALID, S.REGION),
    ("NotImplemented", 501, K.UNSUPPORTED, S.REQUEST),
    ("InvalidAction", 400, K.UNSUPPORTED, S.REQUEST),
]


def test_every_known_code_is_covered_here() -> None:
    assert {c for c, *_ in CASES} == aws_errors.known_codes()


@pytest.mark.parametrize(("code", "status", "kind", "scope"), CASES)
def test_classify_on_demand(code: str, status: int, kind: K, scope: S) -> None:
    failure = aws_errors.classify(code, "AWS says so", http_status=status)
    assert (failure.kind, failure.scope, failure.code, failure.message) == (kind, scope, code, "AWS says so")
    # Only transient errors are resent by botocore, whatever HTTP status AWS used.
    assert aws_errors.should_retry(code, status) is (kind is K.TRANSIENT)


@pytest.mark.parametrize(("code", "status", "kind", "scope"), [c for c in CASES if c[2] is K.CAPACITY])
def test_capacity_on_spot_is_spot_capacity(code: str, status: int, kind: K, scope: S) -> None:
    failure = aws_errors.classify(code, "", http_status=status, use_spot=True)
    assert failure.kind is K.SPOT_CAPACITY and failure.scope is S.ZONE


def test_capacity_errors_sent_as_5xx_are_not_retried() -> None:
    for code in ("InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
                 "InsufficientReservedInstanceCapacity", "InsufficientAddressCapacity"):
        assert aws_errors.should_retry(code, 500) is False
    for code, status in (("RequestLimitExceeded", 503), ("InternalError", 500), ("Unavailable", 503)):
        assert aws_errors.should_retry(code, status) is True


def test_errors_without_a_code_retry_only_on_5xx() -> None:
    assert aws_errors.should_retry(None, 502) is True
    assert aws_errors.should_retry(None, 504) is True
    assert aws_errors.should_retry(None, 400) is False
    assert aws_errors.should_retry(None, None) is False


def test_unknown_codes_by_shape() -> None:
    assert aws_errors.classify("InsufficientGpuCapacity").kind is K.CAPACITY
    assert aws_errors.classify("InsufficientGpuCapacity", use_spot=True).kind is K.SPOT_CAPACITY
    assert aws_errors.classify("GpuQuotaExceeded").kind is K.QUOTA
    assert aws_errors.classify("FancyLimitExceeded").scope is S.REGION
    assert aws_errors.classify("SomethingThrottled").kind is K.TRANSIENT
    assert aws_errors.classify("UnauthorizedThing").kind is K.AUTH
    assert aws_errors.classify("InvalidFoo.NotFound").kind is K.INVALID
    assert aws_errors.classify("Mystery", http_status=500).kind is K.TRANSIENT
    assert aws_errors.should_retry("Mystery", 500) is True
    assert aws_errors.classify("Mystery", http_status=400).kind is K.UNKNOWN
    assert aws_errors.should_retry("Mystery", 400) is False


def test_unsupported_spot_and_stale_instance_types() -> None:
    spot = aws_errors.classify("Unsupported", "The requested Spot configuration is not supported", use_spot=True)
    assert spot.kind is K.SPOT_CAPACITY and spot.scope is S.ZONE
    stale = aws_errors.classify("InvalidParameterValue", "Invalid value 'p9.xlarge' for InstanceType.")
    assert stale.kind is K.UNSUPPORTED and stale.scope is S.REGION
    assert aws_errors.classify("InvalidParameterValue", "Invalid value for MinCount").kind is K.INVALID


def test_auth_errors_carry_an_actionable_hint() -> None:
    unauthorized = aws_errors.classify("UnauthorizedOperation", "Encoded authorization failure message: xyz")
    assert "decode-authorization-message" in unauthorized.hint
    assert "region" in aws_errors.classify("OptInRequired").hint
    assert "Service Quotas" in aws_errors.classify("VcpuLimitExceeded").hint
    assert unauthorized.fatal and not unauthorized.failover


STATE_REASONS = [
    ("Server.SpotInstanceTermination", False, K.SPOT_CAPACITY, S.ZONE),
    ("Server.SpotInstanceShutdown", False, K.SPOT_CAPACITY, S.ZONE),
    ("Server.InsufficientInstanceCapacity", False, K.CAPACITY, S.ZONE),
    ("Server.InsufficientInstanceCapacity", True, K.SPOT_CAPACITY, S.ZONE),
    ("Server.InternalError", False, K.TRANSIENT, S.REQUEST),
    ("Server.ScheduledStop", False, K.TRANSIENT, S.REQUEST),
    ("Client.VolumeLimitExceeded", False, K.QUOTA, S.REGION),
    ("Client.InternalError", False, K.INVALID, S.REQUEST),
    ("Client.InvalidSnapshot.NotFound", False, K.UNSUPPORTED, S.REGION),
    ("Server.SomethingNew", False, K.UNKNOWN, S.ZONE),
]


@pytest.mark.parametrize(("code", "spot", "kind", "scope"), STATE_REASONS)
def test_classify_state_reason(code: str, spot: bool, kind: K, scope: S) -> None:
    failure = aws_errors.classify_state_reason(code, f"{code}: text", use_spot=spot)
    assert failure is not None and (failure.kind, failure.scope, failure.code) == (kind, scope, code)


def test_state_reasons_table_is_covered() -> None:
    assert aws_errors.known_state_reasons() <= {c for c, *_ in STATE_REASONS}


@pytest.mark.parametrize("code", ["Client.UserInitiatedShutdown", "Client.InstanceInitiatedShutdown", "", None])
def test_normal_shutdowns_are_not_failures(code: str | None) -> None:
    assert aws_errors.classify_state_reason(code, "") is None


def test_provision_error_class_follows_the_kind() -> None:
    def err(kind: K) -> object:
        return provision_error(Failure(kind, S.ZONE, "C", "m"), region="r")

    for kind in (K.CAPACITY, K.SPOT_CAPACITY, K.QUOTA, K.UNSUPPORTED):
        assert isinstance(err(kind), CapacityError)
    for kind in (K.AUTH, K.INVALID):
        assert isinstance(err(kind), FatalProvisionError)
    for kind in (K.TRANSIENT, K.UNKNOWN):
        assert isinstance(err(kind), TransientProvisionError)
    e = provision_error(Failure(K.AUTH, S.CLOUD, "UnauthorizedOperation", "no", "grant it"), region="eu-west-1")
    assert str(e) == "UnauthorizedOperation: no (grant it)" and e.region == "eu-west-1" and e.code == "UnauthorizedOperation"


# What a bare `moto_server` (5.x) sends for an EC2 action it does not implement, as botocore's
# ResponseParserError quotes it (the live answer is checked in tests/test_teardown_bare_moto.py).
MOTO_NOT_IMPLEMENTED = (
    "Unable to parse response (syntax error: line 1, column 0), invalid XML received. Further retries may succeed:\n"
    "b'<!doctype html>\\n<html lang=en>\\n<title>500 Internal Server Error</title>\\n<h1>Internal Server Error</h1>"
    "\\n<p>The server encountered an internal error and was unable to complete your request.</p>\\n'"
)


def test_not_implemented_is_classified_and_never_retried() -> None:
    failure = aws_errors.classify_unparsed(MOTO_NOT_IMPLEMENTED, emulator=True)
    assert failure is not None and failure.code == aws_errors.NOT_IMPLEMENTED
    assert (failure.kind, failure.scope) == (K.UNSUPPORTED, S.REQUEST) and aws_errors.not_implemented(failure)
    assert "emulator" in failure.hint
    # From AWS itself an HTML page is not a verdict on the operation: stays transient (None).
    assert aws_errors.classify_unparsed(MOTO_NOT_IMPLEMENTED, emulator=False) is None
    assert aws_errors.classify_unparsed("Unable to parse response: truncated <Response>", emulator=True) is None
    # HTTP 501 means "not implemented" wherever it comes from.
    assert aws_errors.classify_unparsed("", http_status=501) is not None
    assert aws_errors.should_retry(None, 501) is False and aws_errors.should_retry("NotImplemented", 501) is False
    assert aws_errors.not_implemented(aws_errors.classify("InvalidAction")) is True
    assert aws_errors.not_implemented(aws_errors.classify("InternalError")) is False

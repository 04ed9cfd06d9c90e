"""The bus nodes' `authorization {}` and `leafnodes {}` blocks: a template made at synth time,
filled on the node.

Two sides of one format, so both live here (stdlib only: the node runs this file with its own
Python 3.9, not SkyPurza, as it runs bus_streams.py):
- synth (infra/busconfig.py): events/natsauth.py `authorization_block` renders every deployment
  user with a placeholder for its password (`placeholder`), and the `leafnodes {}` block follows
  it: a source stage's (prod's) listener with the leaf user's password slot, or a mirror's (DR's)
  remote URLs with a slot inside each URL (`url_placeholder`). `encode` packs that template with
  each user's Secrets Manager secret name into the bus's SSM parameter; a name may be another
  stage's secret (DR's `leaf` is prod's leaf secret, read in DR's region, where its replica
  is). No password exists at synth time: Secrets Manager draws them at deploy time, so the
  template and the cloud assembly never hold one.
- boot (`main`, run by nats.service before every start and on every reload): read the parameter,
  read each user's secret, `render` the block with the real passwords, and write it (0600) beside
  nats.conf, which includes it; also the `control` user's credentials (0600) for bus_streams.py,
  the one client on the node that makes streams.

Why gzip and base64 in the parameter: the block is ~40 kB of subjects (every contract's grants),
past SSM's 4 kB (standard) and user-data's 16 kB; it compresses ~20x.

Usage on a node: python3 bus-auth.py <region> <parameter name> <config dir> <auth file name> <control user>
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Mapping

_SLOT = "@@bus-password:{user}@@"
# A slot as the template holds it: natsauth writes each password as a JSON string.
_SLOT_RE = re.compile(r'"@@bus-password:([^"@]+)@@"')
# A password inside a URL (a leaf remote's, its userinfo `leaf:<slot>`): no quotes around it, and the
# user part stops at the characters a URL's userinfo cannot hold bare, so the `@` that ends the
# userinfo is never taken for the slot's.
_URL_SLOT = "@@bus-url-password:{user}@@"
_URL_SLOT_RE = re.compile(r'@@bus-url-password:([^"@/:\s]+)@@')
_ANY_SLOT_RE = re.compile(f"{_SLOT_RE.pattern}|{_URL_SLOT_RE.pattern}")


def placeholder(user: str) -> str:
    """What stands for `user`'s password in the template (JSON-safe: json.dumps keeps it as is)."""
    if not user or any(c in user for c in '"@\\'):
        raise ValueError(f"bus user {user!r} cannot have a password slot")
    return _SLOT.format(user=user)


def url_placeholder(user: str) -> str:
    """What stands for `user`'s password inside a URL's userinfo (filled URL-quoted)."""
    if not user or any(c in user for c in '"@\\/:') or any(c.isspace() for c in user):
        raise ValueError(f"bus user {user!r} cannot have a password slot in a URL")
    return _URL_SLOT.format(user=user)


def encode(template: str, secrets: Mapping[str, str]) -> str:
    """The parameter's value: the template and user -> secret name, gzip (mtime 0, so the same
    template synthesizes the same value: no spurious parameter update) in base64."""
    payload = json.dumps({"template": template, "secrets": dict(secrets)}, sort_keys=True).encode()
    return base64.b64encode(gzip.compress(payload, mtime=0)).decode("ascii")


def decode(value: str) -> tuple[str, dict[str, str]]:
    data = json.loads(gzip.decompress(base64.b64decode(value)).decode())
    return data["template"], dict(data["secrets"])


def slots(template: str) -> list[str]:
    """The users whose password slots the template holds, in order."""
    return _SLOT_RE.findall(template)


def url_slots(template: str) -> list[str]:
    """The users whose password the template holds in URLs, in order (one per URL: a remote
    lists every node of its hub, each with the same credentials)."""
    return _URL_SLOT_RE.findall(template)


def render(template: str, passwords: Mapping[str, str]) -> str:
    """The block nats-server reads: every slot filled with its user's password. Refused (no
    partial block, which would lock out or, worse, admit someone) when a slot has no password,
    a password has no slot, a user has two slots or a password is empty. A user's URL slots
    count as slots (several are fine: one per URL of a remote); two password slots are one user
    declared twice."""
    found = slots(template)
    in_urls = url_slots(template)
    doubled = sorted({u for u in found if found.count(u) > 1})
    missing = sorted((set(found) | set(in_urls)) - set(passwords))
    extra = sorted(set(passwords) - set(found) - set(in_urls))
    empty = sorted(u for u, p in passwords.items() if not p)
    if doubled or missing or extra or empty:
        raise ValueError(f"cannot fill the authorization block: doubled {doubled}, no password for {missing}, "
                         f"no slot for {extra}, empty password for {empty}")
    # One pass over both kinds: a password is never searched for slots itself. Quoted in a URL
    # even though Secrets Manager draws letters and digits: a rotated password may hold anything.
    def fill(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return json.dumps(passwords[m.group(1)])
        return urllib.parse.quote(passwords[m.group(2)], safe="")

    return _ANY_SLOT_RE.sub(fill, template)


AWS_CALL_TIMEOUT_S = 60


def _aws(region: str, *args: str) -> str:
    # The AWS CLI the AMI ships (the user data's `aws ssm` calls use it too); the value comes back
    # on stdout, never on a command line another process could read.
    # Bounded: systemd starts nats-server after this, and a hung call would hold the node down.
    return subprocess.run(["aws", "--region", region, *args, "--output", "text"], check=True,
                          capture_output=True, text=True, timeout=AWS_CALL_TIMEOUT_S).stdout.strip()


def fetch_password(region: str, user: str, secret: str) -> str:
    data = json.loads(_aws(region, "secretsmanager", "get-secret-value", "--secret-id", secret,
                           "--query", "SecretString"))
    if not isinstance(data, dict) or data.get("user") != user or not data.get("password"):
        raise ValueError(f"secret {secret} is not the credentials of bus user {user!r}")
    return str(data["password"])


def write_private(path: str, text: str) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)  # nats-server never reads half a block


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    region, parameter, conf_dir, auth_file, control = argv[1:]
    try:
        template, secrets = decode(_aws(region, "ssm", "get-parameter", "--name", parameter, "--query",
                                        "Parameter.Value"))
        passwords = {user: fetch_password(region, user, secret) for user, secret in secrets.items()}
    except subprocess.CalledProcessError as exc:  # one line in the journal; systemd starts it again
        print(f"bus authorization not written: {' '.join(exc.cmd[:5])}: {(exc.stderr or '').strip()[:300]}",
              file=sys.stderr)
        return 1
    except (subprocess.TimeoutExpired, ValueError) as exc:
        print(f"bus authorization not written: {exc}", file=sys.stderr)
        return 1
    write_private(os.path.join(conf_dir, auth_file), render(template, passwords))
    write_private(os.path.join(conf_dir, f"{control}.json"),
                  json.dumps({"user": control, "password": passwords[control]}))
    print(f"bus authorization: {len(passwords)} users")  # names only: never a password in the journal
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

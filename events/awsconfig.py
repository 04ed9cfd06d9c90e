"""One rule for "AWS is configured here", as a pure function (the caller does the looking).

Used wherever a default depends on it: which infras the optimizer enables, whether recovery
watches EC2, where buckets live (recovery creates them, the agent syncs into them: the two must
agree). It is a cheap guess, not a check: no network, no boto3 import; `spz check` makes the
real call. AWS counts as configured when any of these holds:

- an environment variable botocore takes credentials or an endpoint from is set
  (`AWS_ENV_SIGNALS`: an access key, a profile, a web-identity token file, a container
  credentials URI, an endpoint URL such as moto's);
- one of the files botocore reads credentials from exists (`aws_config_files`:
  `AWS_SHARED_CREDENTIALS_FILE` / `AWS_CONFIG_FILE`, else `~/.aws/credentials` and
  `~/.aws/config`).

Callers do the I/O and pass plain values:

    files = [p for p in aws_config_files(os.environ, Path.home()) if p.is_file()]
    aws_configured(os.environ, files)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

# Each one alone means botocore has somewhere to get credentials (or an endpoint) from.
AWS_ENV_SIGNALS = (
    "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_ENDPOINT_URL",
)


def aws_config_files(env: Mapping[str, str], home: Path) -> tuple[Path, ...]:
    """The files botocore would read credentials from, given `env` and the user's home (pure:
    whether they exist is the caller's question). `HOME` in `env` wins over `home`."""
    base = Path(env["HOME"]) if env.get("HOME") else home
    creds = env.get("AWS_SHARED_CREDENTIALS_FILE")
    config = env.get("AWS_CONFIG_FILE")
    return (_under(base, creds) if creds else base / ".aws" / "credentials",
            _under(base, config) if config else base / ".aws" / "config")


def _under(home: Path, path: str) -> Path:
    # `~` expanded against the given home (Path.expanduser would read the process's HOME).
    return home / path[2:] if path.startswith("~/") else (home if path == "~" else Path(path))


def aws_configured(env: Mapping[str, str], existing_files: Iterable[Path | str] = ()) -> bool:
    """Pure: is AWS configured, given the environment and which of `aws_config_files` exist?"""
    if any(env.get(k) for k in AWS_ENV_SIGNALS):
        return True
    return any(True for _ in existing_files)

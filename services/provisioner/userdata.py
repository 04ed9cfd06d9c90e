"""EC2 user-data: the boot script that installs SkyPurza on a node and starts its agent.

One RunInstances call launches a whole gang with ONE user-data, so what differs per node is
read at boot from the instance metadata service (IMDSv2): the rank is EC2's AMI launch index
(the adapter ranks a fresh gang by it), plus the instance id and zone. Node IPs are not known
at launch; the agent reads them from the cluster's ClusterProvisioned event.

The script:
1. reads rank, instance id and zone from IMDSv2;
2. installs SkyPurza into its own virtualenv (`node_install`, a pip requirement), once;
3. in a deployment, writes the cluster's own bus credentials (events/agentusers.py) to a 0600
   file the launcher names in SKYPURZA_NATS_CREDS (the script never echoes them: no `set -x`);
4. writes the agent command (`AgentSpec.command()`) into a launcher script and starts it
   under systemd (restarted on failure, started again on boot), or with nohup where there is
   no systemd.

`agent_argv` is the inverse the test harness uses: given the user-data and what IMDS would
answer, it returns the exact agent command the script would run (it parses the script's own
command line, so a test proves what a node would really start); `agent_credentials` reads back
the credentials it would write.
"""

from __future__ import annotations

import base64
import binascii
import json
import shlex
from dataclasses import replace

from skypurza.events import naming
from skypurza.events.agentspec import AgentSpec
from skypurza.events.natscreds import CREDS_ENV, BusCredentials

VENV = "/opt/skypurza/venv"
PYTHON = f"{VENV}/bin/python"
LAUNCHER = "/opt/skypurza/agent.sh"
CREDS_FILE = "/opt/skypurza/bus-credentials.json"
_CREDS_MARK = "SPZ_BUS_CREDENTIALS"

# Shell variables the script sets at boot, standing in for per-node values.
RANK_VAR = "SPZ_RANK"
INSTANCE_VAR = "SPZ_INSTANCE_ID"
ZONE_VAR = "SPZ_ZONE"
HOME_VAR = "SPZ_HOME"
_ARGV_LINE = "SPZ_ARGV=("
_PER_NODE = {"--rank": RANK_VAR, "--instance-id": INSTANCE_VAR, "--zone": ZONE_VAR, "--home": HOME_VAR}


def unit_name(stage: str) -> str:
    return naming.name(stage, "agent", "node")


def _credentials_part(credentials: BusCredentials | None) -> tuple[str, str]:
    """The lines writing the credentials file, and the launcher's line naming it."""
    if credentials is None:
        return "", ""
    body = json.dumps({"user": credentials.user, "password": credentials.password})
    write = (f"# This cluster's own bus user (its subjects only), readable by the agent's user alone.\n"
             f"(umask 077; cat > {CREDS_FILE} <<'{_CREDS_MARK}'\n{body}\n{_CREDS_MARK}\n)\n"
             f"chmod 600 {CREDS_FILE}\n")
    return write, f"echo {shlex.quote(f'export {CREDS_ENV}={CREDS_FILE}')}; "


def render(spec: AgentSpec, *, install: str, python: str = PYTHON,
           credentials: BusCredentials | None = None) -> str:
    """The user-data script for every node of a gang. `spec` is the gang's agent spec; its
    rank, instance id, zone and home are replaced by what each node reads at boot.
    `credentials`: the cluster's bus user in a deployment (none on an unsecured bus)."""
    template = replace(spec, rank=0, instance_id="x", zone="x", home="x")
    argv = template.command(python="__PYTHON__")
    words: list[str] = []
    flag: str | None = None
    for word in argv:
        if flag in _PER_NODE:
            words.append(f'"${_PER_NODE[flag]}"')
        elif word == "__PYTHON__":
            words.append(shlex.quote(python))
        else:
            words.append(shlex.quote(word))
        flag = word
    unit = unit_name(spec.stage)
    log_file = f"/var/log/{unit}.log"
    venv_cmd = f"python3 -m venv {VENV}"
    creds_write, creds_export = _credentials_part(credentials)
    return f"""#!/bin/bash
# SkyPurza node bootstrap for cluster {_comment(spec.cluster)} (stage {spec.stage}); generated, do not edit.
set -uo pipefail
exec >>{log_file} 2>&1
IMDS=http://169.254.169.254/latest
TOKEN=$(curl -sS -X PUT "$IMDS/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 21600")
md() {{ curl -sSf -H "X-aws-ec2-metadata-token: $TOKEN" "$IMDS/meta-data/$1"; }}
{RANK_VAR}=$(md ami-launch-index)
{INSTANCE_VAR}=$(md instance-id)
{ZONE_VAR}=$(md placement/availability-zone)
SPZ_USER=$(id -nu 1000 2>/dev/null || echo root)
{HOME_VAR}=$(getent passwd "$SPZ_USER" | cut -d: -f6)

# Install SkyPurza once (a reboot or a restarted node keeps it).
if [ ! -x {PYTHON} ]; then
  mkdir -p /opt/skypurza
  {venv_cmd} || {{ apt-get update -q && apt-get install -y -q python3-venv && {venv_cmd}; }}
  {PYTHON} -m pip install --quiet --upgrade pip
  {PYTHON} -m pip install --quiet {shlex.quote(install)}
fi

{creds_write}{_ARGV_LINE} {" ".join(words)} )
{{ echo '#!/bin/bash'; {creds_export}printf 'exec'; printf ' %q' "${{SPZ_ARGV[@]}}"; echo; }} > {LAUNCHER}
chmod 755 {LAUNCHER}
chown -R "$SPZ_USER" /opt/skypurza

if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  cat > /etc/systemd/system/{unit}.service <<EOF
[Unit]
Description=SkyPurza node agent
After=network-online.target
Wants=network-online.target

[Service]
User=$SPZ_USER
ExecStart={LAUNCHER}
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
EOF
  systemctl daemon-reload
  systemctl enable --now {unit}.service
else
  nohup setsid su -s /bin/bash "$SPZ_USER" -c {LAUNCHER} >>{log_file} 2>&1 < /dev/null &
fi
"""


def decode(user_data: str | bytes) -> str:
    """The script text, from the text itself or its base64 form (as DescribeInstanceAttribute gives it)."""
    if isinstance(user_data, bytes):
        user_data = user_data.decode()
    if user_data.startswith("#!"):
        return user_data
    try:
        return base64.b64decode(user_data, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError("user-data is neither a script nor base64 of one") from exc


def agent_argv(user_data: str | bytes, *, rank: int, instance_id: str, zone: str | None = None,
               home: str = "", python: str | None = None) -> list[str]:
    """The agent command the script starts on a node with these metadata answers.

    `python` replaces the node's virtualenv interpreter (a harness runs the agent locally)."""
    text = decode(user_data)
    line = next((ln for ln in text.splitlines() if ln.startswith(_ARGV_LINE)), None)
    if line is None or not line.rstrip().endswith(")"):
        raise ValueError("user-data has no agent command line")
    values = {RANK_VAR: str(rank), INSTANCE_VAR: instance_id, ZONE_VAR: zone or "", HOME_VAR: home}
    argv = []
    for word in shlex.split(line[len(_ARGV_LINE):].rstrip()[:-1]):
        if word.startswith("$") and word[1:] in values:
            word = values[word[1:]]
        argv.append(word)
    if python is not None:
        argv[0] = python
    return argv


def agent_credentials(user_data: str | bytes) -> BusCredentials | None:
    """The bus credentials the script writes for its agent (None: it writes none)."""
    lines = decode(user_data).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.endswith(f"<<'{_CREDS_MARK}'")), None)
    if start is None:
        return None
    data = json.loads(lines[start + 1])
    return BusCredentials(data["user"], data["password"])


def agent_spec(user_data: str | bytes, *, rank: int, instance_id: str, zone: str | None = None,
               home: str = "") -> AgentSpec:
    """The AgentSpec a node with these metadata answers runs."""
    argv = agent_argv(user_data, rank=rank, instance_id=instance_id, zone=zone, home=home)
    if argv[1:3] != ["-m", "skypurza.services.agent"]:
        raise ValueError(f"user-data starts {argv[:3]}, not the agent")
    return AgentSpec.from_argv(argv[3:])


def _comment(text: str) -> str:
    return text.replace("\n", " ")

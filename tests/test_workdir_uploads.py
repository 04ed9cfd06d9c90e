"""A local workdir reaches nodes that are not this machine through the bus's object store
(events/uploads.py, events/workdir_archive.py, cli/uploads.py, services/agent/fetch.py).

Real nats-server (its JetStream object store); the end-to-end runs the agent exactly as EC2's
user-data starts it, on the fake EC2 over HTTP, after the workdir was removed from this machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from agent_harness import job_end, job_lines, of, rank_lines, wait_events
from aws_fixtures import FakeAws
from nats_fixtures import connect_bus
from provisioner_fixtures import aws_env

from skypurza.cli.serve import serve
from skypurza.cli.submit import SubmitError
from skypurza.cli.uploads import send_local_sources
from skypurza.events import naming
from skypurza.events import uploads as up
from skypurza.events import workdir_archive as wa
from skypurza.events.bus import stored_from_msg
from skypurza.events.models import ClusterProvisioned, DownRequested, TaskSubmitted
from skypurza.events.payloads import TaskPayload, UploadRef
from skypurza.events.taskspec.task import Task
from skypurza.services.agent import fetch, mounts
from skypurza.services.provisioner import userdata


def boot_nodes(aws: FakeAws, ev: ClusterProvisioned, root: Path) -> list[subprocess.Popen]:
    """What EC2 and the user-data script do at boot (as tests/test_agent_ec2.py plays it)."""
    ec2 = aws.client(ev.candidate.region or "us-east-1")
    procs = []
    for node in ev.nodes:
        inst = ec2.describe_instances(InstanceIds=[node.instance_id])["Reservations"][0]["Instances"][0]
        raw = ec2.describe_instance_attribute(InstanceId=node.instance_id, Attribute="userData")["UserData"]["Value"]
        home = root / node.instance_id
        home.mkdir(parents=True)
        argv = userdata.agent_argv(raw, rank=inst["AmiLaunchIndex"], instance_id=node.instance_id,
                                   zone=inst["Placement"]["AvailabilityZone"], home=str(home), python=sys.executable)
        env = {**os.environ, **aws.env, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
        with open(home / "agent.log", "ab") as log:
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    return procs


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


WORKDIR = {"hello.txt": "hello from the laptop\n", "sub/run.sh": "#!/bin/sh\necho ran-from-workdir\n",
           ".skyignore": "*.bin\nscratch/\n", "ignored.bin": "x" * 100, "scratch/tmp.txt": "nope",
           "sub/keep.txt": "kept"}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_the_archive_holds_what_a_local_copy_copies_and_is_deterministic(tmp_path: Path) -> None:
    src = _tree(tmp_path / "proj", WORKDIR)
    (src / "sub" / "run.sh").chmod(0o755)
    os.symlink("sub/keep.txt", src / "link")
    os.symlink("/etc/hostname", src / "outside")
    a, b = io.BytesIO(), io.BytesIO()
    first = wa.pack(src, a, 10_000)
    os.utime(src / "hello.txt", (1, 1))  # times, owners and order are not part of the content
    second = wa.pack(src, b, 10_000)
    assert first.digest == second.digest == "sha256:" + hashlib.sha256(a.getvalue()).hexdigest()
    assert a.getvalue() == b.getvalue()
    assert any("outside -> /etc/hostname" in s for s in first.skipped)
    (tmp_path / "a.tgz").write_bytes(a.getvalue())
    wa.unpack(tmp_path / "a.tgz", tmp_path / "node" / "sky_workdir", 10_000)
    for step in mounts.plan(str(src), None, tmp_path / "copy"):
        mounts.apply_step(step)
    # The same files as the agent's local copy (syncignore's rules), less the escaping link.
    assert _files(tmp_path / "node" / "sky_workdir") == _files(tmp_path / "copy" / "sky_workdir") - {"outside"}
    assert "ignored.bin" not in _files(tmp_path / "node" / "sky_workdir")
    assert os.access(tmp_path / "node" / "sky_workdir" / "sub" / "run.sh", os.X_OK)
    assert os.readlink(tmp_path / "node" / "sky_workdir" / "link") == "sub/keep.txt"
    # Changed content, new digest.
    (src / "hello.txt").write_text("changed")
    assert wa.pack(src, io.BytesIO(), 10_000).digest != first.digest


def test_an_unchanged_workdir_is_sent_once(nats_server, tmp_path: Path) -> None:
    src = _tree(tmp_path / "proj", WORKDIR)
    data = tmp_path / "data.txt"
    data.write_text("a file mount")
    public = {"workdir": str(src), "file_mounts": {"~/data.txt": str(data), "/s3": "s3://bucket/x"},
              "run": "true"}
    said: list[str] = []

    async def main():
        bus = await connect_bus(nats_server)
        try:
            one = await send_local_sources(bus, public, say=said.append)
            obs = await up.object_store(bus)
            refs = {k: UploadRef.model_validate(v) for k, v in one["uploads"].items()}
            infos = {k: await up.object_info(obs, r.digest) for k, r in refs.items()}
            two = await send_local_sources(bus, public, say=said.append)
            again = {k: await up.object_info(obs, r.digest) for k, r in refs.items()}
            status = await bus.js.stream_info(f"OBJ_{naming.objects_bucket(bus.stage)}")
            return one, two, refs, infos, again, status
        finally:
            await bus.close()

    one, two, refs, infos, again, status = asyncio.run(main())
    assert set(refs) == {str(src), str(data)}  # the bucket URL is not local
    assert refs[str(src)].kind == "dir" and refs[str(data)].kind == "file"
    assert refs[str(data)].digest == "sha256:" + hashlib.sha256(b"a file mount").hexdigest()
    assert two["uploads"] == one["uploads"]
    # The second submit found the objects and sent nothing: same upload (nuid), same time, and
    # the stream holds exactly one upload of each (chunks + one meta message).
    assert {k: (i.nuid, i.mtime) for k, i in infos.items()} == {k: (i.nuid, i.mtime) for k, i in again.items()}
    assert status.state.messages == sum(i.chunks + 1 for i in infos.values())
    assert status.config.max_age == up.OBJECT_TTL_S
    # The task as the bus carries it: typed, and not a SkyPilot key for the task model.
    payload = TaskPayload.model_validate(one)
    assert payload.uploads[str(src)].digest == refs[str(src)].digest
    assert Task.from_public_dict(payload.to_dict()).workdir == str(src)


def test_the_size_bound_names_the_workdir_the_limit_and_skyignore(nats_server, tmp_path: Path) -> None:
    src = _tree(tmp_path / "big", {"a.bin": "x" * 6000, "b.txt": "y"})

    async def main():
        bus = await connect_bus(nats_server)
        try:
            with pytest.raises(SubmitError) as err:
                await send_local_sources(bus, {"workdir": str(src), "run": "true"}, max_bytes=4096)
            # Ignoring the large file makes it fit.
            (src / ".skyignore").write_text("*.bin\n")
            ok = await send_local_sources(bus, {"workdir": str(src), "run": "true"}, max_bytes=4096)
            return str(err.value), ok
        finally:
            await bus.close()

    message, ok = asyncio.run(main())
    assert message.startswith(f"workdir {src}: 5.9 KiB of files") and "more than the limit of 4 KiB" in message
    assert f"a .skyignore in {src}" in message
    assert ok["uploads"][str(src)]["kind"] == "dir"


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _member(name: str, data: bytes = b"", link: str | None = None) -> tuple[tarfile.TarInfo, bytes | None]:
    ti = tarfile.TarInfo(name)
    if link is not None:
        ti.type, ti.linkname = tarfile.SYMTYPE, link
        return ti, None
    ti.size = len(data)
    return ti, data


async def _put_raw(bus, digest: str, data: bytes) -> None:
    obs = await up.object_store(bus)
    await obs.put(naming.upload_object(digest), data)


@pytest.mark.parametrize("members, why", [
    ([_member("ok.txt", b"fine"), _member("../escaped.txt", b"evil")], "not a relative path"),
    ([_member("/tmp/absolute.txt", b"evil")], "not a relative path"),
    ([_member("up", link="../../etc")], "points outside"),
    # Each link stays inside on its own; together they lead out: refused on the disk.
    ([_member("a/b/y", link="../.."), _member("x", link="a/b/y/../.."), _member("x/escaped.txt", b"evil")],
     "outside"),
])
def test_an_archive_leading_out_of_the_workdir_is_refused(nats_server, tmp_path: Path, members, why) -> None:
    data = _tar(members)
    ref = UploadRef(digest="sha256:" + hashlib.sha256(data).hexdigest(), kind="dir", size=len(data))
    dest = tmp_path / "home" / "sky_workdir"

    async def main():
        bus = await connect_bus(nats_server)
        try:
            await _put_raw(bus, ref.digest, data)
            with pytest.raises(mounts.SyncError) as err:
                await fetch.put_in_place(bus, ref, dest, tmp_path / "home" / ".spz-agent" / "uploads")
            return str(err.value)
        finally:
            await bus.close()

    message = asyncio.run(main())
    assert why in message and "refused" in message
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "home" / "escaped.txt").exists()
    assert not Path("/tmp/absolute.txt").exists()
    assert not list((tmp_path / "home" / ".spz-agent" / "uploads").iterdir())  # no download left behind


def test_a_tampered_object_is_refused(nats_server, tmp_path: Path) -> None:
    src = _tree(tmp_path / "proj", {"hello.txt": "the real one"})

    async def main():
        bus = await connect_bus(nats_server)
        try:
            public = await send_local_sources(bus, {"workdir": str(src), "run": "true"})
            ref = UploadRef.model_validate(public["uploads"][str(src)])
            good = tmp_path / "good"
            await fetch.put_in_place(bus, ref, good, tmp_path / "scratch")
            # Someone with access to the bus replaces the object by other bytes of the same size.
            forged = _tar([_member("hello.txt", b"a forged one")])
            forged = forged[:ref.size].ljust(ref.size, b"\0")
            await _put_raw(bus, ref.digest, forged)
            with pytest.raises(mounts.SyncError) as err:
                await fetch.put_in_place(bus, ref, tmp_path / "bad", tmp_path / "scratch")
            return good, str(err.value)
        finally:
            await bus.close()

    good, message = asyncio.run(main())
    assert (good / "hello.txt").read_text() == "the real one"
    assert "does not match its digest" in message
    assert not (tmp_path / "bad").exists()


def test_a_node_that_is_not_this_machine_gets_the_workdir(nats_server, fake_aws: FakeAws, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`spz launch` of a task with a local workdir on EC2: the agent, started as the user-data
    starts it, finds the workdir (and a file mount) although the paths no longer exist here."""
    for key, value in aws_env(fake_aws, SKYPURZA_HOME=str(tmp_path / "spz"), SKYPURZA_ENABLED_INFRAS="aws",
                              SKYPURZA_LIVE_SPOT_PRICES="0", SKYPURZA_AGENT_NATS_URL=nats_server.url).items():
        monkeypatch.setenv(key, value)
    src = _tree(tmp_path / "laptop" / "proj", WORKDIR)
    (src / "sub" / "run.sh").chmod(0o755)
    data = tmp_path / "laptop" / "notes.txt"
    data.write_text("mounted file\n")
    task = Task.model_validate({
        "name": "wd", "workdir": str(src), "file_mounts": {"~/notes.txt": str(data)},
        "resources": {"infra": "aws/us-east-1", "instance_type": "m5.large"},
        "run": "cat hello.txt; ./sub/run.sh; cat ~/notes.txt; ls -A | sort | tr '\\n' ' '; echo"})
    procs: list[subprocess.Popen] = []

    async def main():
        from skypurza.cli.uploads import for_submit

        bus = await connect_bus(nats_server)
        stop, ready = asyncio.Event(), asyncio.Event()
        services = asyncio.create_task(serve(nats_server.url, "test", ["optimizer", "provisioner"], stop, ready))
        await asyncio.wait_for(ready.wait(), 30)
        try:
            public = await for_submit(bus, task, task.public_dict())
            assert set(public["uploads"]) == {str(src), str(data)}
            shutil.rmtree(tmp_path / "laptop")  # the node can only have it from the object store
            await bus.publish(TaskSubmitted(task_id="wd-task", cluster="wdc", task=public, num_nodes=1, user="dana"))
            subject = naming.event_filter("test", "cluster", ClusterProvisioned.EVENT_NAME)
            async for msg in bus.follow(filter_subject=subject, start_seq=1):
                provisioned = stored_from_msg(msg).event
                break
            procs.extend(await asyncio.to_thread(boot_nodes, fake_aws, provisioned, tmp_path / "nodes"))
            evs = await wait_events(bus, "wdc", lambda evs: len(of(evs, "job_queued")) == 1, timeout=30)
            job = of(evs, "job_queued")[0]
            end = await job_end(bus, "wdc", job.job_id, timeout=60)
            lines = await job_lines(bus, "wdc", job.job_id)
            await bus.publish(DownRequested(cluster="wdc", requested_by="test"))
            await wait_events(bus, "wdc", lambda evs: len(of(evs, "cluster_terminated")) == 1, timeout=60)
            for p in procs:
                await asyncio.to_thread(p.wait, 20)
            return end, lines
        finally:
            stop.set()
            await asyncio.wait_for(services, 30)
            await bus.close()

    try:
        end, lines = asyncio.run(main())
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    out = rank_lines(lines, 0)
    assert end.EVENT_NAME == "job_succeeded", (end, lines)
    assert out[:3] == ["hello from the laptop", "ran-from-workdir", "mounted file"], out
    # .skyignore honoured: neither ignored.bin nor scratch/ travelled.
    assert out[3].split() == [".skyignore", "hello.txt", "sub"], out


def test_what_is_sent_and_when() -> None:
    """Pure: the local sources of a task, and whether a node elsewhere may run it."""
    public = {"workdir": "/home/u/proj", "file_mounts": {
        "~/a": "/home/u/a.txt", "/b": "s3://bucket/b", "/c": {"source": "/home/u/c", "mode": "COPY"},
        "/d": {"name": "bucket"}, "/e": "/home/u/proj"}}
    assert up.local_sources(public) == ["/home/u/proj", "/home/u/a.txt", "/home/u/c"]
    assert up.local_sources({"workdir": {"url": "https://github.com/x/y"}}) == []
    # Only `local` enabled and nothing named: this machine only, nothing is sent.
    assert not up.may_run_elsewhere([None], frozenset({"local"}))
    assert not up.may_run_elsewhere(["local"], frozenset({"aws", "local"}))
    assert up.may_run_elsewhere([None], frozenset({"aws"}))
    assert up.may_run_elsewhere(["aws"], frozenset({"local"}))  # an explicit cloud is always placed there
    assert up.may_run_elsewhere(["local", "aws"], frozenset({"local"}))  # any_of: one alternative is enough


def test_a_long_upload_shows_its_progress_on_stderr(nats_server, tmp_path: Path, capfd) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "weights.bin").write_bytes(os.urandom(9 * 1024 * 1024))  # past PROGRESS_FROM_BYTES, incompressible

    async def main():
        bus = await connect_bus(nats_server)
        try:
            return await send_local_sources(bus, {"workdir": str(src), "run": "true"})
        finally:
            await bus.close()

    public = asyncio.run(main())
    err = capfd.readouterr().err.splitlines()
    assert any(line.startswith(f"Packing workdir {src}: ") and line.endswith("(100%)") for line in err), err
    assert any(line.startswith("Uploading workdir: ") and line.endswith("(100%)") for line in err), err
    assert any(line.startswith(f"Uploaded workdir {src} (9.0 MiB") for line in err), err
    assert public["uploads"][str(src)]["size"] > 9 * 1024 * 1024

"""`stackpin doctor`'s rules on the daemon's own documents (shapes as Engine 28 sends them)."""

from __future__ import annotations

import pytest

from stackpin.doctor import Diagnosis
from stackpin.engine.types import EngineVersion, engine_report, store_of

INFO_28_CONTAINERD = {
    "Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]],
    "CgroupVersion": "2", "CgroupDriver": "systemd", "DefaultRuntime": "runc",
    "Runtimes": {"io.containerd.runc.v2": {}, "runc": {}},
    "SecurityOptions": ["name=seccomp,profile=builtin", "name=cgroupns"],
}
INFO_20_CLASSIC = {
    "Driver": "overlay2", "DriverStatus": [["Backing Filesystem", "extfs"]],
    "CgroupVersion": "1", "CgroupDriver": "cgroupfs", "DefaultRuntime": "runc",
    "Runtimes": {"runc": {}}, "SecurityOptions": ["name=seccomp,profile=default"],
}


def diagnosis(info: dict, *, version: str = "28.5.2", api: str = "1.51",
              buildx: str = "0.29.1") -> Diagnosis:
    engine = EngineVersion(version=version, api_version=api, os="linux", arch="amd64",
                           store=store_of(info))
    return Diagnosis(report=engine_report(engine, info), buildx=buildx)


def test_a_sound_engine_has_no_problem_and_reports_its_store_and_builder():
    found = diagnosis(INFO_28_CONTAINERD)
    assert found.problems() == []
    data = found.to_json()
    assert (data["store"], data["builder"], data["cgroup_version"]) == (
        "containerd", "buildkit", "2")
    assert data["runtimes"] == ["io.containerd.runc.v2", "runc"]
    assert data["timestamps"] == "native"  # BuildKit 0.13+ on the containerd store
    old = diagnosis(INFO_20_CLASSIC, version="20.10.24", api="1.41").to_json()
    # 20.10's BuildKit is opt-in and ignores SOURCE_DATE_EPOCH: `--builder auto` is classic.
    assert (old["store"], old["builder"], old["timestamps"]) == (
        "classic", "classic", "normalised")


def test_without_buildx_or_daemon_buildkit_the_builder_is_classic():
    assert diagnosis(INFO_28_CONTAINERD, buildx="").builder == "classic"
    assert diagnosis(INFO_20_CLASSIC, api="1.38").builder == "classic"


@pytest.mark.parametrize(("store_info", "userns", "expected"), [
    (INFO_28_CONTAINERD, True, 1),
    (INFO_28_CONTAINERD, False, 0),
    (INFO_20_CLASSIC, True, 0),  # userns-remap works with the classic store
])
def test_userns_remap_with_the_containerd_store_is_one_line(store_info, userns, expected):
    info = dict(store_info)
    if userns:
        info["SecurityOptions"] = [*info["SecurityOptions"], "name=userns"]
    problems = diagnosis(info).problems()
    assert len(problems) == expected
    if expected:
        assert "userns-remap" in problems[0] and "daemon.json" in problems[0]
        assert "\n" not in problems[0]


def test_a_daemon_without_runc_or_too_old_is_reported():
    no_runc = {**INFO_20_CLASSIC, "Runtimes": {"crun": {}}}
    assert ["runc" in p for p in diagnosis(no_runc).problems()] == [True]
    assert "older than 20.10" in diagnosis(INFO_20_CLASSIC, version="19.03.15").problems()[0]


def test_disk_free_is_reported_where_the_daemon_keeps_its_data():
    info = {**INFO_20_CLASSIC, "DockerRootDir": "/var/lib/docker", "Name": "build-1"}
    engine = EngineVersion(version="20.10.24", api_version="1.41", os="linux", arch="amd64",
                           store=store_of(info))
    report = engine_report(engine, info)
    assert (report.root_dir, report.host_name) == ("/var/lib/docker", "build-1")
    known = Diagnosis(report=report, buildx="", disk_free=3 * (1 << 30) + (1 << 29))
    assert known.lines()[-1] == "disk free: 3.5 GiB at /var/lib/docker"
    assert (known.to_json()["root_dir"], known.to_json()["disk_free_bytes"]) == (
        "/var/lib/docker", 3758096384)
    remote = Diagnosis(report=report, buildx="")
    assert remote.lines()[-1] == "disk free: - (/var/lib/docker is not on this host)"
    assert remote.to_json()["disk_free_bytes"] is None
    assert remote.problems() == []  # a figure, not a verdict: what a build needs varies


def test_disk_free_is_measured_only_for_a_daemon_on_this_host(tmp_path):
    import shutil
    import socket

    from stackpin.cli.doctor_cmd import local_disk_free

    def report(root: str, name: str):  # type: ignore[no-untyped-def]
        info = {**INFO_28_CONTAINERD, "DockerRootDir": root, "Name": name}
        engine = EngineVersion(version="28.5.2", api_version="1.51", os="linux", arch="amd64",
                               store=store_of(info))
        return engine_report(engine, info)

    here = socket.gethostname()
    measured = local_disk_free(report(str(tmp_path), here))
    assert isinstance(measured, int)
    assert abs(measured - shutil.disk_usage(tmp_path).free) < (1 << 30)
    # Docker Desktop: the folder is the VM's; one of that name here would say nothing.
    assert local_disk_free(report(str(tmp_path), "docker-desktop")) is None
    assert local_disk_free(report(str(tmp_path / "absent"), here)) is None
    assert local_disk_free(report("", here)) is None

"""Hygon DCU with DTK (HIP on the vendor's runtime): K100-AI gfx928, BW gfx936.

Facts from the field (dcu-facts.md): vendor torch builds are labelled
``+das.opt1.dtk2604``; the public index has no DCU torch; these builds need numpy 1;
bitsandbytes has no trusted build; every shell sources the DTK env.sh; HIP reads
HIP_VISIBLE_DEVICES; /dev/kfd, /dev/dri (/dev/mkfd on K100) and /opt/hyhal; freed
device memory lags process exit, so a stop waits until no process holds /dev/kfd.
"""

from __future__ import annotations

import re

from stackpin.platforms.spec import (
    HIP_NODE_PROBES,
    BaseTag,
    PlatformSpec,
    Probe,
    RunDefaults,
    TokenPattern,
    TorchRule,
    TreeFacts,
    VendorLabels,
    WheelLabel,
)


def dtk_version(raw: str) -> str:
    """``2604`` -> 26.04, ``24043`` -> 24.04.3; a dotted value is kept as written."""
    if "." in raw:
        return raw
    point = f".{raw[4:]}" if len(raw) > 4 else ""
    return f"{raw[:2]}.{raw[2:4]}{point}"


# <registry>/dcu/admin/base/<stack>:<stack version>-<os>-dtk<dtk>[-extra...]-py<py>[-suffix]
# e.g. .../vllm:0.8.5-ubuntu22.04-dtk25.04.1-rc5-das1.6-py3.10-20250705 (dcu-facts.md).
_SOURCEFIND = re.compile(
    r"^(?P<registry>[^/]+(?:/[^/]+)*?)/dcu/admin/base/(?P<stack>[a-z0-9._-]+)"
    r":(?P<version>[^-]+)-(?P<os>[a-z]+[0-9][0-9.]*)"
    r"-dtk(?P<toolkit>\d{2}\.\d{2}(?:\.\d+)?)(?:-(?P<extra>.+?))?"
    r"-py(?P<py>\d\.?\d{1,2})(?:-(?P<suffix>.+))?$"
)


def sourcefind_tag(ref: str) -> BaseTag | None:
    """Read a SourceFind DCU base tag; None for references not in that pattern."""
    match = _SOURCEFIND.match(ref.split("@", 1)[0])
    if match is None:
        return None
    py = match["py"]
    python = py if "." in py else f"{py[0]}.{py[1:]}"  # py38 -> 3.8, py310 -> 3.10
    return BaseTag(
        platform="dtk",
        registry=match["registry"],
        stack=match["stack"],
        stack_version=match["version"],
        os=match["os"],
        version=match["toolkit"],
        python=python,
        extra=match["extra"] or "",
        suffix=match["suffix"] or "",
    )


SPEC = PlatformSpec(
    name="dtk",
    title="DTK",
    description="Hygon DCU with the DTK toolkit (HIP on the vendor's runtime)",
    version_example="26.04",
    label=WheelLabel(
        tokens=(
            TokenPattern(kind="das", pattern=r"das(?P<v>\d+(?:\.\d{1,2}(?!\d))?)?"),
            TokenPattern(kind="dtk", pattern=r"dtk(?P<v>\d{2}\.\d{2}(?:\.\d{1,2})?)(?!\d)"),
            TokenPattern(kind="dtk", pattern=r"dtk(?P<v>\d{4,6})(?!\d)"),
        ),
        rank=0,
        version_token="dtk",
        version_of=dtk_version,
        vendor="das",
        exact_version=True,
    ),
    torch=TorchRule(
        expected="a DAS vendor torch for DTK {version} (+das...dtk{compact})",
        fix="pin the vendor torch from the DTK release (wheels/vendor/); the public index "
            "torch has no DCU backend",
        names_version=True,
    ),
    vendor_labels=VendorLabels(
        expected="a DAS build for DTK {version} (+das...dtk{compact})",
        fix="choose the {dist} wheel from the DTK {version} release",
    ),
    numpy1="DTK torch builds need numpy 1",
    bitsandbytes_untrusted="no trusted DTK build exists (a generic wheel claims ROCm support, "
                           "then fails)",
    env_script_example="/opt/dtk/env.sh",
    base_tag=sourcefind_tag,
    serves_product=True,
    visibility_env="HIP_VISIBLE_DEVICES",
    device_hint="/dev/kfd, /dev/dri (and /dev/mkfd)",
    run_defaults=RunDefaults(
        devices=("/dev/kfd", "/dev/dri"), group_add=("video",),
        volumes=("/opt/hyhal:/opt/hyhal:ro",), shm_size="32g",
        ulimits=("memlock=-1:-1", "stack=-1:-1"),
    ),
    backend="rocm",
    collective="nccl",  # RCCL underneath, as on ROCm
    hip_lld_required=True,
    probes=(
        *HIP_NODE_PROBES,
        Probe(kind="folder", target="/opt/hyhal", passed="dtk: /opt/hyhal present",
              failed="dtk: /opt/hyhal is missing: install the DCU driver package (hyhal)"),
    ),
    release_node="/dev/kfd",
    one_profile_per_card=True,
    vendor_tree=TreeFacts(
        # DTK keeps ROCm's layout under its own name; libamdhip64 resolves to libgalaxyhip on
        # the DTK driver (dcu-facts.md). hy-smi comes with hyhal, which the field mounts from
        # the host at /opt/hyhal: a site's mount replaces this stand-in with the real tool.
        product="DTK", root="/opt/dtk-{version}-rehearsal", link="/opt/dtk",
        path=("/opt/dtk/bin", "/opt/hyhal/bin"),
        tools=(("/opt/hyhal/bin/hy-smi", "hy-smi, hyhal's device monitor"),),
        hip_library="libgalaxyhip.so",
    ),
)

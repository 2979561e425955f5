"""CPU only: torch from the PyTorch CPU index (``+cpu``); no cards, no device flags.

What CI proves end to end on every commit (the CPU default cell), on hosted runners.
"""

from __future__ import annotations

from stackpin.platforms.spec import PlatformSpec, Probe, TokenPattern, TorchRule, WheelLabel

SPEC = PlatformSpec(
    name="cpu",
    title="CPU",
    description="CPU only, no accelerator",
    label=WheelLabel(
        tokens=(TokenPattern(kind="cpu", pattern=r"cpu(?P<v>)(?![0-9a-z])"),),
        rank=3,
        build="a CPU-only build",
    ),
    torch=TorchRule(
        expected="a CPU-only torch (+cpu)",
        fix="pin torch from the PyTorch CPU index (download.pytorch.org/whl/cpu)",
        marks=True,
        vendors=("",),
    ),
    backend="cpu",
    collective="gloo",
    probes=(Probe(kind="none", target="", passed="devices: none needed (cpu)"),),
    ci_runner="ubuntu-latest",
)

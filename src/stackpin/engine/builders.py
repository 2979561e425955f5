"""Which builder a build uses: BuildKit where the engine and the docker CLI have it, else the
classic builder; and whether the build comes out reproducible without normalisation
(see ``stackpin.engine.buildx`` for what each engine does). Pure: no SDK, no subprocess."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stackpin.engine.types import EngineReport, EngineVersion
from stackpin.errors import HostEnvironmentError

Builder = Literal["classic", "buildkit"]
BUILDER_CHOICES = ("auto", "buildkit", "classic")
# BuildKit 0.13 (Engine 26) clamps the image config's dates to SOURCE_DATE_EPOCH and added
# the image exporters' rewrite-timestamp option.
NATIVE_TIMESTAMPS_SINCE = 26
# Engine 23.0 made BuildKit the default builder; before, it was opt-in (DOCKER_BUILDKIT=1).
BUILDKIT_DEFAULT_SINCE = 23


@dataclass(frozen=True, kw_only=True)
class BuilderChoice:
    builder: Builder
    # The image is reproducible as built (no normalising): the engine clamps the config,
    # and the layers are clamped by the BuildKit Dockerfile's steps or rewritten by the engine.
    native_timestamps: bool
    reason: str  # why, in a few words (shown by `stackpin build` and `doctor`)
    # Export through a docker-format tar with rewrite-timestamp, then load (the engine
    # rewrites the layers itself): the containerd store's own way, which `auto` no longer
    # picks (the clamped steps do the same without the tar and the second load).
    rewrite_timestamps: bool = False


def _major(version: EngineVersion) -> int:
    word = version.version.split(".")[0]
    return int(word) if word.isdigit() else 0


def native_timestamps(version: EngineVersion) -> bool:
    """Whether this engine's BuildKit clamps the config to SOURCE_DATE_EPOCH, so that the
    BuildKit Dockerfile's clamped steps make the whole image reproducible as built."""
    return _major(version) >= NATIVE_TIMESTAMPS_SINCE


def select_builder(requested: str, *, report: EngineReport, buildx: str) -> BuilderChoice:
    """``auto`` prefers BuildKit where it is the engine's own default builder (Engine 23+)
    and the docker CLI has buildx, else the classic builder.

    Engine 20.10's BuildKit (0.8) is opt-in there and ignores SOURCE_DATE_EPOCH: ``auto``
    keeps the builder the engine defaults to, whose path the CI tier proves on the CPU image.
    ``--builder buildkit`` uses it, the faster of the two there (0.86 of a hand-written
    BuildKit build against 2.12 for the classic one, docs/benchmarks.md), its image config
    rewritten afterwards (normalize_record). Asking for
    ``buildkit`` where it cannot run is a one-line host error, never a silent classic build.
    """
    engine = f"Docker {report.version.version}"
    if requested == "classic":
        return BuilderChoice(builder="classic", native_timestamps=False,
                             reason="classic builder requested")
    missing = ""
    if not report.buildkit:
        missing = f"{engine} has no BuildKit (API {report.version.api_version} < 1.39)"
    elif not buildx:
        missing = ("the docker CLI has no buildx plugin (bash scripts/setup-buildx.sh installs "
                   "Debian's; or Docker's docker-buildx-plugin)")
    if missing and requested == "buildkit":
        msg = f"cannot build with BuildKit: {missing}; or use --builder classic"
        raise HostEnvironmentError(msg)
    if missing:
        return BuilderChoice(builder="classic", native_timestamps=False, reason=missing)
    if requested == "auto" and _major(report.version) < BUILDKIT_DEFAULT_SINCE:
        reason = (f"{engine}'s BuildKit is opt-in and ignores SOURCE_DATE_EPOCH; "
                  "--builder buildkit uses it (faster there; its image config is rewritten)")
        return BuilderChoice(builder="classic", native_timestamps=False, reason=reason)
    native = native_timestamps(report.version)
    how = ("timestamps clamped by the engine (config) and the build steps (layers)" if native
           else "timestamps normalised by stackpin")
    return BuilderChoice(builder="buildkit", native_timestamps=native,
                         reason=f"BuildKit via buildx {buildx} on {engine} "
                                f"({report.version.store} store; {how})")


CLASSIC = BuilderChoice(builder="classic", native_timestamps=False, reason="classic builder")

"""What stackpin knows about one accelerator platform, as data: the ``PlatformSpec``.

Every platform-specific rule reads one of these instead of comparing platform names:
the wheel-label grammar and the torch rule (``abi``, ``checks``), the cell rules
(``checks.settings``, ``checks.studio``), the container run (``runprofile``), the CI
runners (``cimatrix``), and, rendered as data, the image (``image.json``: backend,
collective, device hint) and the bundle (``bin/bundle.conf`` and the profiles: preflight
probes, the card-visibility variable, the stop and start rules). Pure data and small
pure functions; nothing here imports the rest of stackpin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

ProbeKind = Literal["node", "folder", "runtime", "none"]


@dataclass(frozen=True, kw_only=True)
class TokenPattern:
    """One token of a wheel's local version label that marks a build for the platform.

    ``pattern`` is a regular expression (matched case-insensitively at a token's start)
    whose group ``v`` is the raw value the token carries.
    """

    kind: str
    pattern: str


def version_as_written(raw: str) -> str:
    return raw


@dataclass(frozen=True, kw_only=True)
class WheelLabel:
    """How a wheel's local label (``+das.opt1.dtk2604``, ``+cu128``, ``+cpu``) names the platform.

    A label marks the platform when one of ``tokens`` is in it; the ``version_token`` (if
    any) carries the platform version, decoded by ``version_of``. ``vendor`` is what
    ``wheel inspect`` reports as the label's vendor; when a label marks several platforms,
    the lowest ``rank`` is its vendor (a DAS build is a HIP build whose runtime is DTK,
    not ROCm), and ``rank`` also orders what a label is reported as being built for.
    """

    tokens: tuple[TokenPattern, ...]
    rank: int
    version_token: str = ""
    version_of: Callable[[str], str] = version_as_written
    vendor: str = ""
    # DTK 24.04.3 is not 24.04; CUDA and ROCm labels may name only the major (cu12).
    exact_version: bool = False
    build: str = "a {title} {version} build"  # what a label marking the platform means


@dataclass(frozen=True, kw_only=True)
class TorchRule:
    """What the torch wheel's label must say on this platform (public torch has no DCU).

    ``names_version``: the label names the platform's version; ``marks``: the label marks
    the platform; ``vendors``: the label's vendor is one of these ("" for none; empty: any);
    ``forbids``: platforms the label must not mark. ``expected`` and ``fix`` are the
    violation's text, with ``{version}`` and ``{compact}`` (the version without dots).
    """

    expected: str
    fix: str
    names_version: bool = False
    marks: bool = False
    vendors: tuple[str, ...] = ()
    forbids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class VendorLabels:
    """Every ABI-bound wheel of a cell must name the platform version in its label: an
    unlabelled attention wheel is an error, other unlabelled vendor wheels a warning."""

    expected: str  # with {version} and {compact}
    fix: str  # with {dist} and {version}


@dataclass(frozen=True, kw_only=True)
class Probe:
    """One host check of bin/preflight.sh: PASS with ``passed``, FAIL with ``failed``.

    ``node``: the device node exists; ``folder``: the folder exists; ``runtime``: the
    engine has this container runtime (or its CLI is installed); ``none``: nothing to
    check (say ``passed``).
    """

    kind: ProbeKind
    target: str
    passed: str
    failed: str = ""
    # A runtime probe on Podman, which reaches cards through CDI instead: WARN with the
    # first when a CDI spec is present, FAIL with the second when none is.
    podman_cdi: str = ""
    podman_no_cdi: str = ""



def node_probe(node: str) -> Probe:
    """The preflight check that a device node exists, in the words every HIP and CUDA
    platform uses (its kernel driver makes the node)."""
    return Probe(kind="node", target=node, passed=f"device: {node}",
                 failed=f"device: {node} is missing (driver not loaded?)")


# The nodes a HIP runtime opens (DTK and ROCm alike): the KFD and the render nodes.
HIP_NODE_PROBES = (node_probe("/dev/kfd"), node_probe("/dev/dri"))

@dataclass(frozen=True, kw_only=True)
class RunDefaults:
    """The run flags a new cell of the platform starts from (the field's, dcu-facts.md).

    A cell's ``[run]`` table is what its images run with; these are the documented
    starting point and what a shipped cell is held to (a test), never merged silently.
    """

    devices: tuple[str, ...] = ()
    group_add: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    shm_size: str = ""
    gpus: str = ""
    ulimits: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class BaseTag:
    """The axes a vendor's base image tag encodes: a cell's base must agree with its pins.

    ``version`` is the platform's (the DTK release of ``...-dtk26.04-py3.10``).
    """

    platform: str
    registry: str
    stack: str
    stack_version: str
    os: str
    version: str
    python: str
    extra: str = ""
    suffix: str = ""


def no_base_tag(_reference: str) -> BaseTag | None:
    return None


@dataclass(frozen=True, kw_only=True)
class TreeFacts:
    """Where a platform's vendor tree lives in its base image and what that base puts on
    PATH: what a vendor rehearsal's stand-in tree copies (stackpin.vendortree)."""

    product: str  # how the vendor names it: DTK, ROCm
    root: str  # the versioned folder; {version} is the cell's platform_version
    link: str  # the unversioned name the cells use (/opt/dtk, /opt/rocm)
    path: tuple[str, ...]  # PATH entries the vendor base image puts before Debian's
    tools: tuple[tuple[str, str], ...]  # (absolute path, what it stands in for)
    hip_library: str  # the HIP runtime library's file name in lib/


@dataclass(frozen=True, kw_only=True)
class PlatformSpec:
    """One platform, declared once (the module ``stackpin.platforms.<name>``)."""

    name: str  # the matrix's `platform`, the image label, bundle.conf
    title: str  # how messages name it: "DTK 26.04"
    description: str  # one line for docs and `--help`
    version_example: str = ""  # "26.04"; empty: the platform has no version (cpu)
    # --- wheels and the cell's own rules
    label: WheelLabel
    torch: TorchRule
    vendor_labels: VendorLabels | None = None
    numpy1: str = ""  # non-empty: why every torch build here needs numpy 1
    bitsandbytes_untrusted: str = ""  # non-empty: why bitsandbytes must stay disabled
    env_script_example: str = ""  # non-empty: the cell must name its env script (/opt/dtk/env.sh)
    # Reads the vendor's base image tags (SourceFind's for DTK); None for any other reference.
    base_tag: Callable[[str], BaseTag | None] = no_base_tag
    serves_product: bool = False  # every cell declares Studio, or says what blocks it
    # --- running a container
    visibility_env: str = ""  # the variable that chooses cards ("" = no cards)
    device_hint: str = ""  # how a run passes its devices, for "no device is visible"
    run_defaults: RunDefaults = field(default_factory=RunDefaults)
    # --- in the image (image.json) and at the site (bundle.conf, profiles)
    backend: str  # what torch reports on it: HIP builds keep torch.cuda but say rocm
    collective: str  # torch.distributed backend of two or more devices
    # Triton on HIP links with TRITON_HIP_LLD_PATH; an image of this platform must set it.
    hip_lld_required: bool = False
    probes: tuple[Probe, ...] = ()
    # A process that held a card keeps it until this node is released: stop.sh waits for
    # `fuser NODE` to list nobody (freed device memory lags process exit, dcu-facts.md).
    release_node: str = ""
    one_profile_per_card: bool = False  # start refuses a second profile: never train on both
    # The vendor tree of its base image, for a vendor rehearsal; None: it has none.
    vendor_tree: TreeFacts | None = None
    # --- CI
    ci_runner: str = ""  # a hosted runner's label; empty: self-hosted, <name>, <arch>

    @property
    def accelerator(self) -> bool:
        """Whether images of the platform expect devices (it has cards to choose)."""
        return bool(self.visibility_env)

    def titled(self, version: str) -> str:
        return f"{self.title} {version}" if version else self.title

    def image_facts(self) -> dict[str, object]:
        """What the image's verification reads about its platform (image.json)."""
        return {
            "title": self.title,
            "backend": self.backend,
            "accelerator": self.accelerator,
            "collective": self.collective,
            "device_hint": self.device_hint,
            "visibility_env": self.visibility_env,
            "hip_lld_required": self.hip_lld_required,
        }


def compact(version: str) -> str:
    """``26.04`` -> ``2604``: how vendor labels write a version."""
    return version.replace(".", "")


def filled(template: str, version: str, **more: str) -> str:
    return template.format(version=version, compact=compact(version), **more)

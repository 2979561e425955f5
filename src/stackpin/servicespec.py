"""The service an image serves, as matrix data (``[cells.X.service]``).

One declaration drives the Dockerfile's EXPOSE/HEALTHCHECK/CMD, ``bin/start.sh``,
``stackpin serve``, verify L8 and the bundle README; the rules on it live here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from stackpin.declared import doc

LOOPBACK = "127.0.0.1"  # the only host address a service port is ever published on
# Every service starts offline: without these Studio runs a pip/git "self-heal" of
# diffusers at each start and asks the hub at the first model load. Its state (accounts,
# chats, runs) and the caches it writes outside that folder go to the profile's state.
SERVICE_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "UNSLOTH_DISABLE_DIFFUSERS_AUTOREPAIR": "1",
    "UNSLOTH_DIFFUSERS_MAIN": "0",
    "UNSLOTH_STUDIO_HOME": "{state_dir}/studio",
    "HF_HOME": "{state_dir}/huggingface",
    "TORCHINDUCTOR_CACHE_DIR": "{state_dir}/cache/torchinductor",
}


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """Where one variant's service answers on the host, and whether server-side tools run."""

    port: int = field(metadata=doc("Host port, published on 127.0.0.1 only."))
    tools: bool = field(
        metadata=doc("Server-side tools (web search, code execution) on for every request.")
    )


@dataclass(frozen=True, kw_only=True)
class Service:
    """The service an image serves (Unsloth Studio's backend), declared once.

    The Dockerfile's EXPOSE, HEALTHCHECK and CMD, bin/start.sh, `stackpin serve` and the
    bundle README are all derived from this table.
    """

    command: tuple[str, ...] = field(
        default=("python", "/opt/stackpin/serve.py", "--host", "0.0.0.0", "--port", "{port}"),
        metadata=doc("argv in the container; {port} is replaced by container_port."),
    )
    container_port: int = field(default=8888, metadata=doc("Port the service binds inside."))
    tools_on: tuple[str, ...] = field(
        default=("--enable-tools",), metadata=doc("Arguments added when tools are on.")
    )
    tools_off: tuple[str, ...] = field(
        default=("--disable-tools",), metadata=doc("Arguments added when tools are off.")
    )
    health_path: str = field(
        default="/api/health",
        metadata=doc('GET path that answers JSON {"status": "healthy"} when ready.'),
    )
    ready_timeout: int = field(
        default=300, metadata=doc("Seconds start waits for a healthy answer before giving up.")
    )
    state_dir: str = field(
        default="/var/lib/stackpin/state",
        metadata=doc("Container path of the profile's state folder (accounts, chats, runs)."),
    )
    models_dir: str = field(
        default="/workspace/models",
        metadata=doc("Container path of the site's models/ folder (mounted read-only)."),
    )
    password_file: str = field(
        default="{state_dir}/studio/auth/.bootstrap_password",
        metadata=doc("Where the service writes its first-login password ({state_dir} replaced)."),
    )
    env: Mapping[str, str] = field(
        default_factory=dict,
        metadata=doc(
            "Added to (or overriding) the offline defaults; {state_dir} is replaced."
        ),
    )
    stable: Endpoint = field(
        default_factory=lambda: Endpoint(port=18888, tools=False),
        metadata=doc("The stable variant's endpoint (seed: 18888, tools off)."),
    )
    enhanced: Endpoint = field(
        default_factory=lambda: Endpoint(port=18887, tools=True),
        metadata=doc("The enhanced variant's endpoint (seed: 18887, tools on)."),
    )

    # A variant by its value ("stable", "enhanced"): matrix.Variant is a str, and this module
    # stays below the matrix that declares it.
    def endpoint(self, variant: str) -> Endpoint:
        return self.stable if variant == "stable" else self.enhanced

    def argv(self, variant: str) -> tuple[str, ...]:
        """The service command of one variant, with its port and tool switch filled in."""
        base = tuple(a.replace("{port}", str(self.container_port)) for a in self.command)
        return base + (self.tools_on if self.endpoint(variant).tools else self.tools_off)

    def bootstrap_password(self) -> str:
        return self.password_file.replace("{state_dir}", self.state_dir)

    def environment(self) -> dict[str, str]:
        """The service's environment in the image: offline defaults, then the cell's env."""
        merged = {**SERVICE_ENV, **self.env}
        return {k: v.replace("{state_dir}", self.state_dir) for k, v in sorted(merged.items())}


def service_problems(service: Service) -> list[tuple[str, str]]:
    """(key under the service table, message) for each broken rule."""
    problems: list[tuple[str, str]] = []
    ports = [("container_port", service.container_port), ("stable.port", service.stable.port),
             ("enhanced.port", service.enhanced.port)]
    for key, port in ports:
        if not 1 <= port <= 65535:
            problems.append((key, f"{port} is not a port (1-65535)"))
    if service.stable.port == service.enhanced.port:
        problems.append(("enhanced.port", "stable and enhanced need different host ports"))
    if not service.command:
        problems.append(("command", "give the service's argv"))
    if not service.health_path.startswith("/"):
        problems.append(("health_path", "must start with '/'"))
    if service.ready_timeout < 1:
        problems.append(("ready_timeout", "must be at least 1 second"))
    for key in ("state_dir", "models_dir"):
        if not getattr(service, key).startswith("/"):
            problems.append((key, "must be an absolute container path"))
    return problems


@dataclass(frozen=True, kw_only=True)
class ServiceBlocker:
    """Why a cell serves no Studio: the one requirement of a Studio-bearing release it fails.

    `matrix check` verifies the claim against the cell's own pins (the requirement must
    really exclude the cell's version) and prints it as one line.
    """

    of: str = field(
        metadata=doc("The Studio-bearing release that cannot be installed: unsloth 2026.10.9.")
    )
    requirement: str = field(
        metadata=doc("Its requirement the cell fails (PEP 508), e.g. torch>=2.4.0,<2.15.0.")
    )

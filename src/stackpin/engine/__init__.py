"""The container engine seen by the pipeline: plain types and one protocol, no SDK.

``types`` holds the requests and results, ``protocol`` the ``Engine`` every verb takes, and
``docker_api`` (imported only where a daemon is reached: the CLI and the integration tests)
the docker-py transport, with ``docker_build`` for the classic builder's stream.
"""

from stackpin.engine.protocol import Engine
from stackpin.engine.types import (
    BindMount,
    BuildRequest,
    BuildResult,
    EngineVersion,
    ImageInfo,
    LoadResult,
    RunRequest,
    RunResult,
    SaveRequest,
    chunk_stream,
    digest_matches,
    image_info_from_inspect,
    with_run_flags,
)

__all__ = [
    "BindMount",
    "BuildRequest",
    "BuildResult",
    "Engine",
    "EngineVersion",
    "ImageInfo",
    "LoadResult",
    "RunRequest",
    "RunResult",
    "SaveRequest",
    "chunk_stream",
    "digest_matches",
    "image_info_from_inspect",
    "with_run_flags",
]

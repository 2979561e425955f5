# The fast hand-written BuildKit Dockerfile of today's uv guides, for the same installs as
# `stackpin build` of the CPU default: the same base, the same locked wheels checked against
# the same hashes (--require-hashes), network off (--network none), --no-deps, torch's layer
# before the stack's, the wheels and uv bind-mounted so neither reaches a layer, and uv
# compiling bytecode as it installs (UV_COMPILE_BYTECODE=1, as uv's Docker guide sets it).
# uv comes from the same pinned wheel stackpin stages (tools/ of its build context).
# scripts/bench-speed.sh builds it beside stackpin in stackpin's own staged context, as the
# second yardstick (BENCH_UV=1). No guard, no labels, no verification package, no clamp.
ARG BASE
FROM ${BASE} AS uv
ARG UV_WHEEL
RUN --mount=type=bind,source=tools,target=/tmp/tools \
    mkdir /uv && python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
        open("/uv/uv", "wb").write(z.read(next(n for n in z.namelist() if n.endswith("/scripts/uv"))))' \
        "/tmp/tools/${UV_WHEEL}" && chmod 0755 /uv/uv

FROM ${BASE}
ENV UV_COMPILE_BYTECODE=1 UV_NO_CACHE=1
RUN python3 -m venv /opt/venv
RUN --mount=type=bind,source=wheels/vendor,target=/tmp/wheels \
    --mount=type=bind,from=uv,source=/uv,target=/uv \
    /uv/uv pip install --python /opt/venv/bin/python --offline --no-index --no-deps \
        --require-hashes --find-links /tmp/wheels -r /tmp/wheels/requirements.txt
RUN --mount=type=bind,source=wheels/stack,target=/tmp/stack \
    --mount=type=bind,source=wheels/pure,target=/tmp/pure \
    --mount=type=bind,source=wheels/pinned,target=/tmp/pinned \
    --mount=type=bind,from=uv,source=/uv,target=/uv \
    /uv/uv pip install --python /opt/venv/bin/python --offline --no-index --no-deps \
        --require-hashes --find-links /tmp/stack --find-links /tmp/pure \
        --find-links /tmp/pinned -r /tmp/stack/requirements.txt \
        -r /tmp/pure/requirements.txt -r /tmp/pinned/requirements.txt
ENV PATH=/opt/venv/bin:$PATH

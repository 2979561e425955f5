# The same installs as `stackpin build` of the CPU default, as a fast hand-written BuildKit
# Dockerfile does them; scripts/bench-speed.sh builds it beside stackpin, in stackpin's own
# staged build context (build/context/CELL-stable: wheels/<layer>/ with each layer's
# hash-locked requirements.txt). The same base, the same wheels checked against the same
# hashes, network off (--network none), --no-deps, torch's layer before the stack's, the
# wheels bind-mounted so none reaches a layer, pip compiling bytecode as it installs.
# No guard, no labels, no verification package: it is the yardstick, not a product.
ARG BASE
FROM ${BASE}
RUN python3 -m venv /opt/venv
RUN --mount=type=bind,source=wheels/vendor,target=/tmp/wheels \
    /opt/venv/bin/pip install --no-index --no-deps --require-hashes --no-cache-dir \
        --find-links /tmp/wheels -r /tmp/wheels/requirements.txt
RUN --mount=type=bind,source=wheels/stack,target=/tmp/wheels \
    /opt/venv/bin/pip install --no-index --no-deps --require-hashes --no-cache-dir \
        --find-links /tmp/wheels -r /tmp/wheels/requirements.txt
ENV PATH=/opt/venv/bin:$PATH

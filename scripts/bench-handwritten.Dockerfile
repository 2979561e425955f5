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
# The rest of the stack in one step, as a person writes it (stackpin splits it in three
# layers by how often each moves: compiled, pure-Python unpinned, pinned by the cell).
RUN --mount=type=bind,source=wheels/stack,target=/tmp/stack \
    --mount=type=bind,source=wheels/pure,target=/tmp/pure \
    --mount=type=bind,source=wheels/pinned,target=/tmp/pinned \
    /opt/venv/bin/pip install --no-index --no-deps --require-hashes --no-cache-dir \
        --find-links /tmp/stack --find-links /tmp/pure --find-links /tmp/pinned \
        -r /tmp/stack/requirements.txt -r /tmp/pure/requirements.txt \
        -r /tmp/pinned/requirements.txt
ENV PATH=/opt/venv/bin:$PATH

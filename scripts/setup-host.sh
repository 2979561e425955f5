#!/usr/bin/env bash
# Prepare this host for stackpin: OS tools (Docker engine, mmdebstrap, zstd, jq; for the
# tests shellcheck, chromium and chromedriver), a running Docker daemon, and the project's
# virtual environment with stackpin installed.
# Safe to run again: each step is skipped when already done. One line per step.
# --engines: also the engine matrix (Docker 28, classic and containerd image stores, beside
# the default engine; scripts/setup-engines.sh) and the site tier's tools (Podman, skopeo,
# Debian's docker-registry). The README's command 1 needs one engine.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || need_apt+=(mmdebstrap)
command -v zstd >/dev/null 2>&1 || need_apt+=(zstd)
command -v jq >/dev/null 2>&1 || need_apt+=(jq)
# The tests use these; under CI=true a test whose tool is missing fails (tests/tools.py).
command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
if ((${#need_apt[@]})); then
    if [ "$(id -u)" != 0 ]; then
        say "missing ${need_apt[*]}: install them (sudo apt-get install -y ${need_apt[*]}) and rerun"
        exit 8
    fi
    say "installing ${need_apt[*]} from the OS packages"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
else
    say "docker, mmdebstrap, zstd, jq, shellcheck, chromium, chromedriver present"
fi

if docker info >/dev/null 2>&1; then
    say "Docker daemon answers ($(docker version --format '{{.Server.Version}}'))"
elif [ "$(id -u)" = 0 ]; then
    say "starting dockerd (log: /var/log/stackpin-dockerd.log)"
    nohup dockerd >/var/log/stackpin-dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { say "dockerd did not come up; see /var/log/stackpin-dockerd.log"; exit 8; }
    say "Docker daemon up ($(docker version --format '{{.Server.Version}}'))"
else
    say "no Docker daemon answers: start one (sudo systemctl start docker) and rerun"
    exit 8
fi

py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $($py --version)"
    "$py" -m venv .venv
fi
if ! .venv/bin/python -c 'import stackpin, pytest, mypy, torch, transformers' >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.stackpin-installed ]; then
    say "installing stackpin and its test stack into .venv (torch 2.13.0+cpu for the verify tests)"
    # (grep drops pip's notes about this host's unreadable extra index folders)
    .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]' -r requirements-test.txt 2>&1 \
        | { grep -v '^WARNING: Location .* is ignored' || true; }
    touch .venv/.stackpin-installed
else
    say "stackpin installed in .venv"
fi

# BuildKit for the default engine too (bookworm packages no docker-buildx): the Docker
# tier builds with it on every engine.
bash scripts/setup-buildx.sh

if [ "${1:-}" = --engines ]; then
    bash scripts/setup-engines.sh
    # The site tier (issue 25): Podman as a third engine, skopeo and Debian's registry
    # (distribution 2.8) for the site registry, curl for push.sh's HEAD checks.
    site_apt=()
    for pair in podman:podman skopeo:skopeo docker-registry:docker-registry curl:curl \
                catatonit:catatonit nsenter:util-linux; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || site_apt+=("${pair#*:}")
    done
    if ((${#site_apt[@]})); then
        say "installing ${site_apt[*]} from the OS packages (the site tier)"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${site_apt[@]}" >/dev/null
        # The package starts a registry on :5000 where systemd runs: the tests start their own.
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker-registry 2>/dev/null; then
            systemctl disable --now docker-registry >/dev/null 2>&1 || true
        fi
    else
        say "podman, skopeo, docker-registry, curl, catatonit present"
    fi
fi

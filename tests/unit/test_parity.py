"""Rules that exist in Python and in the site scripts' bash: held equal here.

The site scripts cannot import stackpin (a site may have nothing but bash, coreutils and
openssl), so the caps, the zstd window, the exit codes, the trust order and the label
keys are spelled in bin/lib.sh and bin/load.sh too. ``bash_drift`` reads those texts and
names every place they differ from the Python constants; each kind of drift is shown to
be caught by editing one value in a copy of the text.
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from stackpin import signing, target
from stackpin.bundle import format as bundle_format
from stackpin.bundle import load, trust
from stackpin.errors import (
    BundleError,
    ConfigurationError,
    HostEnvironmentError,
    VerificationError,
)

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "bundle" / "bin"
BASH_FILES = [*sorted(BIN.glob("*.sh")), *sorted((ROOT / "scripts").glob("*.sh"))]
SITE_SCRIPTS = {path.name for path in BIN.glob("*.sh")}

CAPS = {
    "MAX_MANIFEST_BYTES": bundle_format.MAX_MANIFEST_BYTES,
    "MAX_SUMS_BYTES": bundle_format.MAX_SUMS_BYTES,
    "MAX_KEY_BYTES": signing.MAX_KEY_BYTES,
    "SIGNATURE_BYTES": signing.SIGNATURE_BYTES,
}
EXIT_CODES = {
    "EXIT_USAGE": click.UsageError.exit_code,
    "EXIT_CONFIGURATION": ConfigurationError.return_code,
    "EXIT_VERIFICATION": VerificationError.return_code,
    "EXIT_BUNDLE": BundleError.return_code,
    "EXIT_HOST": HostEnvironmentError.return_code,
}
LABEL_KEYS = {value for name, value in vars(target).items()
              if name.startswith(("LABEL_", "OCI_")) and name not in ("LABEL_PREFIX", "OCI_PREFIX")}
# A label key as bash spells one (docker --label/--filter, templates).
BASH_LABEL = re.compile(r"\b(?:io\.stackpin|org\.opencontainers\.image)\.[a-z][a-z0-9.-]*[a-z0-9]")
# Exit codes must be the named ones: a number only in the child script that probes a port
# (its `exit 1` is that child's failure, read by the caller as "no answer").
LITERAL_EXIT = re.compile(r"\b(?:die_with|give_up|profile_image) [0-9]|\bexit [1-9]")
CHILD_EXIT = 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1'


def declared_site_trust_file() -> str:
    """trust.SITE_TRUST_FILE as the module declares it (the tests' conftest points the
    imported module elsewhere, so no test trusts the host's key)."""
    tree = ast.parse(Path(trust.__file__).read_text(encoding="utf-8"))
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [getattr(t, "id", "") for t in node.targets] == ["SITE_TRUST_FILE"]]
    assert isinstance(value, ast.Call) and isinstance(value.args[0], ast.Constant)
    return str(value.args[0].value)


def assignments(text: str) -> dict[str, str]:
    """Top-level NAME=value lines (quotes dropped)."""
    return {m[1]: m[2].strip("'\"") for m in re.finditer(r"^([A-Z_][A-Z0-9_]*)=(\S*)$",
                                                          text, re.M)}


def bash_drift(texts: dict[str, str]) -> Iterator[str]:
    """Every difference between the bash texts (by file name) and Python's constants."""
    lib = texts["lib.sh"]
    values = assignments(lib)
    for name, python in {**CAPS, **EXIT_CODES}.items():
        if values.get(name) != str(python):
            yield f"lib.sh {name}={values.get(name)}, Python says {python}"
    window = re.search(r"zstd -dc --memory=(\d+)MB", texts["load.sh"])
    if window is None or int(window[1]) << 20 != load.MAX_WINDOW:
        yield f"load.sh's zstd window {window and window[0]} is not {load.MAX_WINDOW} bytes"
    site_file = declared_site_trust_file()
    if values.get("SITE_TRUST_FILE") != site_file:
        yield f"lib.sh SITE_TRUST_FILE={values.get('SITE_TRUST_FILE')}, Python says {site_file}"
    if f"TRUST_PUBKEY=${{{trust.PUBKEY_ENV}:-}}" not in lib:
        yield f"lib.sh does not take the key from ${trust.PUBKEY_ENV}"
    if f'opt_in {trust.INSECURE_ENV} "${{{trust.INSECURE_ENV}:-}}"' not in lib:
        yield f"lib.sh does not read the opt-out {trust.INSECURE_ENV}"
    for name, text in texts.items():
        for key in sorted(set(BASH_LABEL.findall(text)) - LABEL_KEYS):
            yield f"{name} uses label key {key}, which stackpin.target does not declare"
        code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        for line in code if name in SITE_SCRIPTS else ():
            if LITERAL_EXIT.search(line.split("  #")[0]) and CHILD_EXIT not in line:
                yield f"{name} exits with a number, not a named EXIT_ code: {line.strip()}"


def shipped_texts() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in BASH_FILES}


def test_bash_and_python_agree_on_caps_window_exit_codes_trust_and_label_keys():
    assert list(bash_drift(shipped_texts())) == []


@pytest.mark.parametrize(("file", "old", "new", "named"), [
    ("lib.sh", "MAX_MANIFEST_BYTES=16777216", "MAX_MANIFEST_BYTES=16777217",
     "MAX_MANIFEST_BYTES"),
    ("lib.sh", "MAX_SUMS_BYTES=16777216", "MAX_SUMS_BYTES=1677721", "MAX_SUMS_BYTES"),
    ("lib.sh", "MAX_KEY_BYTES=65536", "MAX_KEY_BYTES=65537", "MAX_KEY_BYTES"),
    ("lib.sh", "SIGNATURE_BYTES=64", "SIGNATURE_BYTES=65", "SIGNATURE_BYTES"),
    ("load.sh", "--memory=128MB", "--memory=256MB", "zstd window"),
    ("lib.sh", "EXIT_BUNDLE=7", "EXIT_BUNDLE=1", "EXIT_BUNDLE"),
    ("lib.sh", "EXIT_HOST=8", "EXIT_HOST=9", "EXIT_HOST"),
    ("lib.sh", "SITE_TRUST_FILE=/etc/stackpin/trusted.pub",
     "SITE_TRUST_FILE=/etc/stackpin/trust.pub", "SITE_TRUST_FILE"),
    ("lib.sh", "TRUST_PUBKEY=${STACKPIN_PUBKEY:-}", "TRUST_PUBKEY=${STACKPIN_KEY:-}",
     "STACKPIN_PUBKEY"),
    ("start.sh", "--label io.stackpin.profile=", "--label io.stackpin.profil=",
     "io.stackpin.profil"),
    ("verify.sh", 'profile_image "$EXIT_HOST"', "profile_image 1", "exits with a number"),
    ("stop.sh", 'die_with "$EXIT_USAGE"', "die_with 1", "exits with a number"),
])
def test_each_kind_of_drift_is_named(file, old, new, named):
    texts = shipped_texts()
    assert old in texts[file], (file, old)
    texts[file] = texts[file].replace(old, new, 1)
    drift = list(bash_drift(texts))
    assert len(drift) == 1 and named in drift[0], drift


# --- the trust order, run: the same key (or refusal) from bash and from Python -----------


def _bash_choice(flag: Path | None, env: Path | None, site: Path, insecure: bool) -> str:
    """What lib.sh's take_common_args + choose_trusted_key pick: 'ORIGIN PATH' or a word."""
    args = ["--pubkey", str(flag)] if flag else []
    environ = {"PATH": "/usr/bin:/bin", **({"STACKPIN_PUBKEY": str(env)} if env else {}),
               **({"STACKPIN_INSECURE_UNSIGNED": "1"} if insecure else {})}
    script = (f'. {BIN / "lib.sh"}; SITE_TRUST_FILE={site}; take_common_args "$@"; '
              'if [ "$INSECURE" -eq 1 ]; then echo insecure; exit 0; fi; choose_trusted_key; '
              'echo "${TRUST_ORIGIN:-} ${TRUST_PUBKEY:-none}"')
    done = subprocess.run(["bash", "-c", script, "_", *args], env=environ, capture_output=True,
                          text=True, check=True)
    choice = done.stdout.strip()
    return "none" if choice.endswith(" none") else choice


def _python_choice(flag: Path | None, env: Path | None, site: Path, insecure: bool) -> str:
    environ = {**({trust.PUBKEY_ENV: str(env)} if env else {}),
               **({trust.INSECURE_ENV: "1"} if insecure else {})}
    try:
        chosen = trust.resolve(flag, environ=environ, site_file=site)
    except BundleError:
        return "none"
    return "insecure" if chosen.insecure else chosen.origin


def test_bash_and_python_choose_the_same_trusted_key(tmp_path):
    keys = {name: signing.generate(tmp_path / name).public_path
            for name in ("flag", "env", "site")}
    missing_site = tmp_path / "no-site.pub"
    seen = set()
    for flag, env, site, insecure in itertools.product((None, keys["flag"]), (None, keys["env"]),
                                                       (missing_site, keys["site"]),
                                                       (False, True)):
        python = _python_choice(flag, env, site, insecure)
        assert _bash_choice(flag, env, site, insecure) == python, (flag, env, site, insecure)
        seen.add(python.split(" ")[0])
    # Every outcome occurred: each source wins somewhere, the opt-out, and the refusal.
    assert seen == {"--pubkey", "STACKPIN_PUBKEY", "site", "insecure", "none"}

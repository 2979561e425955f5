"""Issue 12 item 5: Unsloth Studio from the CPU image, used in a real browser.

Debian's Chromium (installed by scripts/setup-host.sh), headless, driven by Playwright's
Python client with ``executable_path`` (no browser download), against the container that
``stackpin serve`` runs with a fresh state folder and the tiny generated model: the first
page takes the bootstrap password and a new one, the new one signs in again after logout,
the retired one is refused, a chat message gets a reply. Screenshots go to a temporary
folder, or to ``$STACKPIN_SCREENSHOTS`` (docs/service/ holds the committed ones):

    STACKPIN_SCREENSHOTS=docs/service pytest -m docker tests/integration/test_studio_browser.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import CPU_CELL, ROOT
from tests.integration import studio_browser
from tests.integration.loopback import free_port
from tests.tools import default_sigint, need_module, need_tool

pytestmark = pytest.mark.docker

NEW_PASSWORD = "Stackpin-browser-2026"


@pytest.fixture(scope="module")
def studio(cpu_image, tiny_models: Path, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """`stackpin serve` of the CPU image with its own state: (URL, state folder)."""
    state = tmp_path_factory.mktemp("browser-state")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stackpin.cli.main", "serve", CPU_CELL, "--port", str(port),
         "--models", str(tiny_models), "--state", str(state)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=default_sigint)  # Ctrl-C must reach serve even from a background runner
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip())
            if "healthy at" in line:
                break
        assert any("healthy at" in line for line in lines), "\n".join(lines[-40:])
        yield f"http://127.0.0.1:{port}/", state
    finally:
        proc.send_signal(signal.SIGINT)  # serve stops and removes its container
        proc.wait(timeout=120)
    assert proc.returncode == 130
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=io.stackpin.state={state.resolve()}"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert left == []


def test_first_login_password_change_and_a_chat_reply_in_chromium(studio, tmp_path):
    need_tool("chromium")
    need_module("playwright")
    url, state = studio
    bootstrap_file = state / "studio" / "auth" / ".bootstrap_password"
    bootstrap = bootstrap_file.read_text().strip()
    shots = Path(os.environ.get("STACKPIN_SCREENSHOTS") or tmp_path / "shots")
    seen = studio_browser.walk(
        url, bootstrap, NEW_PASSWORD, shots=shots,
        load=lambda: studio_browser.load_model(url, NEW_PASSWORD, "/workspace/models/tiny"))

    assert seen.setup_asked_current_password  # no bootstrap autofill for a proxied client
    assert seen.signed_in_after_change
    assert seen.wrong_password_refused
    assert seen.signed_in_again
    # The server agrees with what the page showed: the change happened there.
    assert not bootstrap_file.exists()
    assert studio_browser.login(url, bootstrap)[0] == 401
    assert studio_browser.login(url, NEW_PASSWORD)[0] == 200
    # A reply from the model (gibberish: a random model), under the message that was sent.
    assert seen.user_message == studio_browser.MESSAGE
    assert seen.chat_run_status in (200, 202)
    assert seen.reply
    assert seen.reply not in (studio_browser.MESSAGE, "Working...")
    assert [p.name for p in seen.shots] == [
        "01-first-start-bootstrap-password.png", "02-password-changed-signed-in.png",
        "03-old-password-refused.png", "04-chat-reply.png"]
    assert all(p.stat().st_size > 10_000 for p in seen.shots)  # rendered pages, not blanks

"""Drive Unsloth Studio's web UI in headless Chromium (Debian's, not a downloaded one).

One function walks the first-use path a person takes: the first page asks for the
bootstrap password (as "Current password") and a new one; the new one signs in; the
signed-in user logs out and logs in again with it; a wrong password is refused; a chat
message gets an assistant reply. The caller loads the model (over the API, with the new
password) because the UI's model picker lists hub and cache models, not a local folder.
Screenshots of each step go to ``shots``.

The reply of the project's tiny random model is gibberish: the check is that an assistant
message with text appears under the user's message, never what it says.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
# The brief's flags: no GPU, no QUIC, nothing phoning home (a fresh profile per run).
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
USER = "unsloth"
MESSAGE = "Hello from a headless browser"
MAX_TOKENS = 64  # Studio's least: a short reply on CPU
VIEWPORT = {"width": 1280, "height": 800}
STEP_MS = 120_000  # a bound per UI step on a shared 2-core host, not a speed claim
REPLY_MS = 300_000  # first CPU generation compiles through inductor


@dataclass(frozen=True, kw_only=True)
class Walkthrough:
    """What the browser saw, for the test to assert on."""

    setup_asked_current_password: bool
    signed_in_after_change: bool
    wrong_password_refused: bool
    signed_in_again: bool
    user_message: str
    chat_run_status: int  # Studio's answer to the UI's chat request
    reply: str
    shots: tuple[Path, ...]


def api(base: str, method: str, path: str, body: dict[str, Any] | None = None,
        token: str | None = None, timeout: float = 600) -> tuple[int, dict[str, Any]]:
    """One JSON call to Studio's API: (status, body); HTTP errors are returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base.rstrip("/") + path, data=data, headers=headers,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def login(base: str, password: str) -> tuple[int, str]:
    status, body = api(base, "POST", "/api/auth/login", {"username": USER, "password": password})
    return status, str(body.get("access_token", ""))


def load_model(base: str, password: str, model_path: str) -> dict[str, Any]:
    """Load ``model_path`` (a path inside the service) for chat; fails loudly with its detail."""
    status, token = login(base, password)
    assert status == 200, f"login with the new password: {status}"
    status, body = api(base, "POST", "/api/inference/load",
                       {"model_path": model_path, "load_in_4bit": False,
                        "max_seq_length": 2048}, token=token)
    # Studio answers 200 early for slow loads and reports failure inside the body.
    assert status == 200, f"model load: {status} {body}"
    assert "_deferred_error" not in body, f"model load failed: {body['_deferred_error']}"
    return body


def walk(url: str, bootstrap_password: str, new_password: str, *, shots: Path,
         load: Callable[[], object],
         extra_headers: dict[str, str] | None = None) -> Walkthrough:
    """Run the first-use path in a fresh Chromium profile; ``load`` loads the chat model."""
    from playwright.sync_api import sync_playwright

    shots.mkdir(parents=True, exist_ok=True)
    taken: list[Path] = []

    with tempfile.TemporaryDirectory(prefix="stackpin-chromium-") as profile, \
            sync_playwright() as driver:
        context = driver.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport=VIEWPORT, extra_http_headers=extra_headers or {},
        )
        context.set_default_timeout(STEP_MS)
        page = context.new_page()

        def shot(name: str) -> None:
            # The app can fall back to its "Loading..." screen after a route change (seen
            # under load right after sign-in): never photograph that instead of the page.
            page.get_by_text("Loading...", exact=True).first.wait_for(state="hidden")
            path = shots / f"{name}.png"
            page.screenshot(path=str(path))
            taken.append(path)

        page.goto(url)
        current = page.get_by_label("Current password")
        current.wait_for()
        asked = current.is_visible()
        current.fill(bootstrap_password)
        page.get_by_label("New password").fill(new_password)
        page.get_by_label("Confirm password").fill(new_password)
        shot("01-first-start-bootstrap-password")
        page.get_by_role("button", name="Change password").click()
        message_box = page.get_by_label("Message input")
        message_box.wait_for()  # visible: the chat page, which only a signed-in user sees
        signed_in = not page.url.rstrip("/").endswith(("/login", "/change-password"))
        account_menu = page.get_by_role("button", name="Unsloth account menu")
        account_menu.wait_for()  # the app shell has rendered, not only its loading screen
        shot("02-password-changed-signed-in")

        account_menu.click()
        page.get_by_role("menuitem", name="Log out").click()
        page.wait_for_url("**/login")
        page.get_by_label("Password").fill(bootstrap_password)  # retired by the change
        # Listening before the click: a 401 that comes back before a listener set up after
        # it is never seen (CI waited 120 s for a response that had already arrived).
        with page.expect_response(lambda r: r.url.endswith("/api/auth/login")) as refused:
            page.get_by_role("button", name="Login").click()
        refused_status = refused.value.status
        refusal = page.get_by_text("Incorrect password")  # what the person sees
        refusal.wait_for()
        wrong_refused = refused_status == 401 and page.url.endswith("/login")
        shot("03-old-password-refused")
        page.get_by_label("Password").fill(new_password)
        page.get_by_role("button", name="Login").click()
        message_box.wait_for()
        signed_in_again = not page.url.rstrip("/").endswith("/login")

        load()
        page.reload()
        message_box.wait_for()
        max_tokens = page.get_by_label("Max Tokens")  # Studio's least is 64; its default 2048
        if max_tokens.evaluate("e => e.closest('[inert]') !== null"):  # the panel is shut
            page.get_by_role("button", name="Open run settings").click()
        max_tokens.fill(str(MAX_TOKENS))
        max_tokens.press("Tab")
        page.get_by_role("button", name="Close run settings").click()
        message_box.fill(MESSAGE)
        with page.expect_response(lambda r: r.request.method == "POST"
                                  and r.url.endswith("/api/inference/chat-runs"),
                                  timeout=REPLY_MS) as run:
            page.get_by_role("button", name="Send message").click()
        run_status = run.value.status
        user = page.locator("[data-role=user]").last
        assistant = page.locator("[data-role=assistant]").last
        # The reply streams in: "Working..." first, then the model's tokens.
        page.wait_for_function(
            "() => { const a = [...document.querySelectorAll('[data-role=assistant]')].pop();"
            " const t = a ? a.innerText.trim() : ''; return t.length > 0 && t !== 'Working...'; }",
            timeout=REPLY_MS)
        shot("04-chat-reply")
        result = Walkthrough(
            setup_asked_current_password=asked, signed_in_after_change=signed_in,
            wrong_password_refused=wrong_refused, signed_in_again=signed_in_again,
            user_message=user.inner_text().strip(), reply=assistant.inner_text().strip(),
            chat_run_status=run_status,
            shots=tuple(taken),
        )
        context.close()
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the walkthrough against a running Studio and keep the screenshots.

    python -m tests.integration.studio_browser URL STATE_DIR MODEL_PATH OUT_DIR
    (STATE_DIR: the host folder mounted as the service's state; MODEL_PATH: inside it.)
    """
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    for name in ("url", "state", "model", "out"):
        parser.add_argument(name)
    parser.add_argument("--new-password", default="Stackpin-browser-2026")
    args = parser.parse_args(argv)
    bootstrap = (Path(args.state) / "studio" / "auth" / ".bootstrap_password").read_text().strip()
    seen = walk(args.url, bootstrap, args.new_password, shots=Path(args.out),
                load=lambda: load_model(args.url, args.new_password, args.model))
    print(json.dumps({k: str(v) for k, v in vars(seen).items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

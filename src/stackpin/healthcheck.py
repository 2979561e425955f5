"""The image's HEALTHCHECK: exit 0 only when the service answers JSON {"status": "healthy"}.

Standard library only. A port that merely accepts connections is not enough: Studio binds
before its app is ready, and an error page with status 200 must not count as healthy.

    python /opt/stackpin/healthcheck.py http://127.0.0.1:8888/api/health
"""

from __future__ import annotations

import json
import sys
import urllib.request


def healthy(url: str, timeout: float = 5.0) -> tuple[bool, str]:
    """(healthy, why) for one GET of the health URL."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(65536)
    except OSError as exc:
        return False, f"{url}: no answer ({exc})"
    try:
        status = json.loads(body).get("status")
    except (ValueError, AttributeError):
        return False, f"{url}: not a JSON object: {body[:80]!r}"
    if status != "healthy":
        return False, f"{url}: status is {status!r}, not 'healthy'"
    return True, f"{url}: healthy"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: healthcheck.py URL", file=sys.stderr)
        return 2
    ok, why = healthy(argv[0])
    print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m stackpin_verify``: run the checks, write report.json and report.xml."""

from __future__ import annotations

import os

# No downloads of any kind: the tiny model and tokenizer are built in code. Set before
# transformers or huggingface_hub can be imported by any level.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from stackpin_verify.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

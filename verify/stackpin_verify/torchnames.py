"""torch's own words, in one place: device types and the backend a build reports.

These are torch's API, not stackpin's platform names: ``torch.device("cuda")`` is a HIP
device on ROCm and DTK builds too (they keep the torch.cuda API), and a HIP build says
so only through ``torch.version.hip``. What an image's *platform* expects of them (which
backend, which collective, how devices are passed) is data in image.json's
``platform_facts``, rendered from stackpin's platform spec; nothing here names a platform.
"""

from __future__ import annotations

CPU = "cpu"  # torch.device type of the host
GPU = "cuda"  # torch.device type of every torch.cuda device: NVIDIA, and AMD/DCU under HIP

# What `environment.detect_backend` reports: a HIP build is "rocm" (never "cuda", even
# though torch.cuda.is_available() is True there), a CUDA build with a device "cuda".
BACKEND_HIP = "rocm"
BACKEND_CUDA = "cuda"
BACKEND_CPU = "cpu"

# torch.distributed's collectives: NCCL for torch.cuda devices (RCCL underneath on HIP),
# what L7 runs where image.json names none (a bare host); gloo on CPU, L7's fallback with
# fewer than two devices.
NCCL = "nccl"
GLOO = "gloo"

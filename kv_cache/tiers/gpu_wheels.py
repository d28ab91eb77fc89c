"""Which CuPy and kvikio wheels match this host's NVIDIA driver, for `make install`.

CuPy and kvikio ship one wheel per CUDA major version (cupy-cuda12x / cupy-cuda13x, kvikio-cu12 / kvikio-cu13),
and a wheel built for a newer CUDA than the driver supports fails at its first call. The driver's CUDA version is
the one nvidia-smi prints in its header ("CUDA Version: 13.0"). Prints the two extras to install (the gpu and the
gds one) on stdout and the reason on stderr; exit 1 when no GPU driver answers. Standard library only.
"""

from __future__ import annotations

import re
import subprocess
import sys

EXTRAS = {12: ("gpu", "gds"), 13: ("gpu-cu13", "gds-cu13")}  # pyproject's optional dependencies per CUDA major


def driver_cuda_major(smi_text: str) -> int | None:
    """The CUDA major version in nvidia-smi's header, or None."""
    m = re.search(r"CUDA Version:\s*(\d+)\.\d+", smi_text)
    return int(m.group(1)) if m else None


def extras_for(major: int | None) -> tuple[tuple[str, str], str]:
    """((gpu extra, gds extra), why) for a driver's CUDA major version."""
    if major in EXTRAS:
        return EXTRAS[major], f"the driver supports CUDA {major}: {' and '.join(EXTRAS[major])} extras"
    newest = max(EXTRAS)
    if major is not None and major > newest:
        return EXTRAS[newest], (f"the driver supports CUDA {major}, newer than any wheel named here: the CUDA "
                                f"{newest} wheels ({' and '.join(EXTRAS[newest])} extras) run on it")
    return EXTRAS[12], (f"nvidia-smi did not say which CUDA the driver supports ({major}): the CUDA 12 wheels "
                        f"(gpu and gds extras)")


def main() -> int:
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"gpu_wheels: nvidia-smi did not answer ({e})", file=sys.stderr)
        return 1
    (gpu, gds), why = extras_for(driver_cuda_major(out))
    print(f"gpu_wheels: {why}", file=sys.stderr)
    print(gpu, gds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

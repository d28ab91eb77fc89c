"""Make fixtures/mlperf_reference_keys.json: the key paths the MLPerf reference's --output FILE holds, from real
runs of its code. Its code is not in this project: point this at a checkout of its kv_cache_benchmark/ folder.

    python tests/mlperf_reference.py /path/to/storage/kv_cache_benchmark COMMIT

Each command line below runs the reference for a few seconds on this machine (numpy and pyyaml are all it
needs for these), in a temporary folder removed after; the union of their key paths is written to OUT.
A list of objects is written as `name[]` once, its elements' keys as `name[].key`. The reference's
device-latency tracing (--enable-latency-tracing) needs kprobes, which this VM's kernel lacks: its optional
`device_latency_tracing` and `fio_workload` keys are not in the list.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = ["--model", "llama3.1-8b", "--num-users", "4", "--gpu-mem-gb", "0", "--cpu-mem-gb", "0.5", "--seed", "42"]
RUNS = {  # name -> its flags beyond COMMON: one run per documented mode the schema depends on
    "latency": ["--duration", "10"],
    "throughput": ["--duration", "10", "--performance-profile", "throughput"],
    "rag": ["--duration", "10", "--enable-rag"],
    "autoscaler_qos": ["--duration", "40", "--enable-autoscaling", "--autoscaler-mode", "qos"],
    "autoscaler_capacity": ["--duration", "40", "--enable-autoscaling", "--autoscaler-mode", "capacity"],
}
OUT = Path(__file__).parent / "fixtures" / "mlperf_reference_keys.json"


def key_paths(obj, prefix: str = "") -> set[str]:
    """Every key path of a JSON value: a.b.c, lists of objects as a[] with their elements' keys under a[]."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            path = f"{prefix}.{k}" if prefix else k
            out.add(path)
            out |= key_paths(v, path)
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, dict):
                out |= key_paths(v, prefix + "[]")
    return out


def main(folder: str, commit: str) -> None:
    paths: set[str] = set()
    for name, flags in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            cmd = [sys.executable, "kv-cache.py", *COMMON, *flags, "--cache-dir", tmp, "--output", str(out)]
            subprocess.run(cmd, cwd=folder, check=True, capture_output=True, timeout=300)
            paths |= key_paths(json.loads(out.read_text()))
        print(f"{name}: {len(paths)} key paths so far")
    OUT.write_text(json.dumps({
        "source": f"MLCommons Storage KV-cache reference, kv_cache_benchmark/ at {commit}, run on this project's "
                  f"CI-class VM by {Path(__file__).name}",
        "runs": {name: " ".join(["kv-cache.py", *COMMON, *flags]) for name, flags in RUNS.items()},
        "key_paths": sorted(paths)}, indent=1) + "\n")
    print(f"wrote {OUT}: {len(paths)} key paths")


if __name__ == "__main__":
    main(*sys.argv[1:3])

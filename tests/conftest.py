"""Shared test helpers: the real CLI in a subprocess, small settings, tiny tiers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from servers import media_with_servers

REPO = Path(__file__).resolve().parent.parent
SMALL = REPO / "tests" / "fixtures" / "small.yaml"
SHARED_TRACES = REPO.parent / "shared" / "traces"
# Real trace text stays out of the repository: these tests read the development workspace's copies beside the clone
TRACES_ABSENT = (f"the real trace slices (ShareGPT, BurstGPT, Azure, Mooncake: public data, see SOURCES.md there) "
                 f"are read from ../shared/traces beside the clone, absent here ({SHARED_TRACES})")
needs_shared_traces = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=TRACES_ABSENT)
# The MLPerf Storage reference (its kv_cache_benchmark/ and mlpstorage) at a56caea, as a tarball beside the clone;
# MLPSTORAGE_CHECKOUT (a work tree or a git directory of github.com/hazemawadalla/storage) takes its place
REFERENCE_TARBALL = REPO.parent / "shared" / "mlperf-reference" / "storage-a56caea.tar.gz"
REFERENCE_ABSENT = (f"the MLPerf reference is absent: neither MLPSTORAGE_CHECKOUT (a checkout of "
                    f"github.com/hazemawadalla/storage) nor ../shared/mlperf-reference/storage-a56caea.tar.gz beside "
                    f"the clone ({REFERENCE_TARBALL}) is here")


@pytest.fixture(scope="session")
def mlperf_reference(tmp_path_factory) -> Path:
    """The reference repository's root (mlpstorage_py/, kv_cache_benchmark/): MLPSTORAGE_CHECKOUT's work tree (a
    git directory is cloned), else the tarball unpacked once for the session; skipped, saying which, without both."""
    source = os.environ.get("MLPSTORAGE_CHECKOUT", "")
    if source and (Path(source) / "kv_cache_benchmark").is_dir():
        return Path(source)
    if source and (Path(source) / "HEAD").is_file():
        root = tmp_path_factory.mktemp("mlperf-reference") / "storage"
        r = subprocess.run(["git", "clone", "-q", source, str(root)], capture_output=True, text=True, timeout=300)
        if r.returncode:
            pytest.skip(f"MLPSTORAGE_CHECKOUT={source} could not be cloned: {r.stderr.strip()[-200:]}")
        return root
    if not REFERENCE_TARBALL.is_file():
        pytest.skip(REFERENCE_ABSENT)
    import tarfile

    into = tmp_path_factory.mktemp("mlperf-reference")
    with tarfile.open(REFERENCE_TARBALL) as tar:
        tar.extractall(into, filter="data")
    return into / "storage-a56caea"


@pytest.fixture(scope="session", autouse=True)
def children_keep_their_bytecode(tmp_path_factory):
    """Where the environment forbids bytecode files (PYTHONDONTWRITEBYTECODE, as on this project's VMs), each run of
    the CLI the tests start compiled every module from source again: 0.85 s a run that refuses a flag, 0.59 s with
    bytecode kept. The tests' children keep theirs in the session's temporary folder (PYTHONPYCACHEPREFIX), never
    beside the sources; the environment is restored after the session."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        yield
        return
    before = {k: os.environ.get(k) for k in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def bounded(n: int) -> list[str]:
    """Flags of a run that ends after n requests however slow or busy the machine: no warm-up, and a duration far
    beyond what n requests take. A test asserts what the run did, never how fast (make bench measures speed)."""
    return ["--max-requests", str(n), "--warmup", "0", "--duration", "600"]


def run_cli(args: list[str], timeout: float = 120, extra_env: dict | None = None,
            **kw) -> subprocess.CompletedProcess:
    """Run kv_cache_benchmark.py with args (and extra_env over this environment); capture text output."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    return subprocess.run([sys.executable, str(REPO / "kv_cache_benchmark.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, **kw)


@pytest.fixture
def small_run(tmp_path):
    """Arguments for a short real run writing into tmp_path; returns (args, results path factory)."""
    out, cache = tmp_path / "reports", tmp_path / "cache"
    cache.mkdir()

    def make(run_id: str = "t", *extra: str, quiet: bool = True) -> list[str]:
        return ["--config", str(SMALL), "--output-dir", str(out), "--cache-dir", str(cache), "--run-id", run_id,
                *(["--quiet"] if quiet else []), *extra]

    def results(run_id: str = "t") -> dict:
        return json.loads((out / run_id / "results.json").read_text())

    make.results = results
    make.cache = cache
    make.out = out
    return make


@pytest.fixture
def small_tmpfs(tmp_path):
    """Mount small tmpfs filesystems (root only) to run out of space safely; skip where impossible."""
    mounted = []

    def mount(size_mib: int) -> Path:
        point = tmp_path / f"fs{len(mounted)}"
        point.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(point)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or 'not root'})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def serving(what: str, start, folder, **kw):
    """A fixture's server from tests/servers.py: started in folder, yielded, stopped after; skips, saying why,
    where it cannot start."""
    try:
        server = start(folder, **kw)
    except (RuntimeError, ImportError) as e:
        pytest.skip(f"no {what} here: {e}")
    yield server
    server.stop()


def _medium_server(medium: str):
    """A session fixture <medium>_server: the real server the medium's module declares (local_server), on
    127.0.0.1 for the whole session; skips, saying why, where none can start."""
    @pytest.fixture(scope="session", name=f"{medium}_server")
    def fixture(tmp_path_factory):
        from servers import start

        yield from serving(f"{medium} server", lambda folder: start(medium, folder), tmp_path_factory.mktemp(medium))
    return fixture


for _medium in media_with_servers():  # a new remote medium brings its server fixture with its module
    globals()[f"{_medium}_server"] = _medium_server(_medium)


@pytest.fixture(autouse=True)
def leaves_nothing_in_the_repository():
    """A run the test made leaves no file in the repository's folder: a reference command line without --output
    writes benchmark_results_<time>.json into its current folder (a test must give it one of its own)."""
    before = set(os.listdir(REPO))
    yield
    left = sorted(set(os.listdir(REPO)) - before - {".pytest_cache", ".ruff_cache"})
    if left:
        for name in left:
            if name.startswith("benchmark_results_"):
                os.unlink(REPO / name)
        pytest.fail(f"the test left {', '.join(left)} in {REPO}")

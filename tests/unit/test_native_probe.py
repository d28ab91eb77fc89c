"""Native engines are probed in a child process (kv_cache/tiers/native.py): a binding built for instructions this
CPU lacks dies by SIGILL, which no `try` catches (the liburing wheel did on an AVX2-only EPYC; the io_uring engine
now speaks the system calls itself, and the probe stays for any native engine). CI's machines may have AVX-512, so
a planted sitecustomize that kills the probe's child with SIGILL forces the crash path: the run, the test session
and make install's check survive it."""

import subprocess
import sys

from conftest import REPO, bounded, run_cli

SIGILL_PROBE = '''import os, signal, sys
if "--probe-here" in sys.argv:  # the probe's child only: the process that asked for it runs on
    os.kill(os.getpid(), signal.SIGILL)
'''


def planted(tmp_path) -> dict:
    """An environment in which a native probe's child dies by SIGILL, as a binding built for AVX-512 did."""
    d = tmp_path / "binding"
    d.mkdir()
    (d / "sitecustomize.py").write_text(SIGILL_PROBE)
    return {"PYTHONPATH": f"{d}:{REPO}"}


def test_a_run_on_a_binding_that_dies_by_sigill_is_one_sentence(small_run, tmp_path):
    r = run_cli(small_run("u", "--io-engine", "io_uring", *bounded(5)), extra_env=planted(tmp_path))
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "SIGILL" in r.stderr and "io_uring" in r.stderr
    assert "--io-engine direct" in r.stderr  # what to do instead
    assert not (tmp_path / "reports" / "u").exists()


def test_make_install_s_check_tells_a_crash_apart(tmp_path):
    """Exit 3 (a crash, said by make install) for the planted SIGILL, 0 or 1 for the real engine."""
    import os

    env = dict(os.environ, **planted(tmp_path))
    r = subprocess.run([sys.executable, "-m", "kv_cache.tiers.uring", "--check"], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
    assert r.returncode == 3 and "died by SIGILL" in r.stdout, (r.returncode, r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "kv_cache.tiers.uring", "--check"], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode in (0, 1), (r.returncode, r.stdout, r.stderr)


def test_the_engine_s_probe_never_runs_the_binding_in_this_process(tmp_path, monkeypatch):
    """This test process survives the probe of an engine that kills whoever runs it."""
    from kv_cache.tiers.uring import UringEngine

    monkeypatch.setenv("PYTHONPATH", planted(tmp_path)["PYTHONPATH"])
    why = UringEngine().unavailable()
    assert "died by SIGILL" in why and "illegal instruction" in why

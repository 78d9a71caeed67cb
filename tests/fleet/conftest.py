"""Fixtures of the fleet-table tests: the deepspan binary and one real,
analysed recording (the demo's row-lock scenario)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_addoption(parser):
    parser.addoption(
        "--deepspan",
        default=os.environ.get("DEEPSPAN", str(REPO / "target/release/deepspan")),
        help="the deepspan binary (default: $DEEPSPAN or target/release/deepspan)",
    )


@pytest.fixture(scope="session")
def deepspan(request):
    binary = Path(request.config.getoption("--deepspan"))
    if not binary.is_file():
        pytest.fail(f"no deepspan binary at {binary} (build it: cargo build --release -p deepspan)")
    return binary


def kernel_tracing_available():
    return os.geteuid() == 0 and Path("/sys/kernel/tracing/instances").is_dir()


@pytest.fixture(scope="session")
def run(deepspan, tmp_path_factory):
    """An analysed run: $DEEPSPAN_FLEET_RUN (copied), else a fresh recording
    of `deepspan demo --scenario db-row-lock` (needs root and tracefs; skips
    without them unless DEEPSPAN_REQUIRE_KERNEL is set, as the Rust kernel
    tests do)."""
    keep = tmp_path_factory.mktemp("fleet")
    given = os.environ.get("DEEPSPAN_FLEET_RUN")
    if given:
        shutil.copytree(given, keep / "run", symlinks=True)
        return keep / "run"
    if not kernel_tracing_available():
        if os.environ.get("DEEPSPAN_REQUIRE_KERNEL"):
            pytest.fail("DEEPSPAN_REQUIRE_KERNEL is set but kernel tracing is unavailable")
        pytest.skip("kernel tracing unavailable (root and tracefs needed to record)")
    env = dict(os.environ, DEEPSPAN_DEMO_DIR=str(REPO / "demo"), PYTHONPATH=str(REPO / "sdk/python"))
    done = subprocess.run(
        [str(deepspan), "demo", "--scenario", "db-row-lock", "--format", "json", "--keep", str(keep)],
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, -19),
    )
    run = keep / "db-row-lock"
    assert (run / "analysis" / "requests.json").is_file(), (
        f"the demo left no analysed run ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    return run

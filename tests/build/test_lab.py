"""`make lab` starts for everyone, root included, and serves the notebooks.

The test runs the Makefile's own target on a free localhost port with a token and no browser,
fetches notebooks/01_costs.ipynb through the server's REST API, and stops the server through that
API, all within bounded times. CI runs as root: there this is the case Jupyter used to refuse
("Running as root is not recommended") until `make lab` passed --allow-root.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "notebooks/01_costs.ipynb"
START_TIMEOUT = 90       # seconds for JupyterLab to answer (slow to import on a busy machine)
STOP_TIMEOUT = 20        # seconds for it to exit after /api/shutdown


def free_port() -> int:
    """A localhost port that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str, token: str, method: str = "GET") -> tuple[int, bytes]:
    """One request with the token; (status, body), or (0, b"") when nothing answers yet."""
    request = urllib.request.Request(url, method=method,
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def stop(process: subprocess.Popen) -> None:
    """End the process group that `make lab` leads (make and its jupyter), if it still runs."""
    if process.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                continue


def test_make_lab_passes_allow_root():
    """Root or not, the recipe carries --allow-root (harmless for anyone else)."""
    recipe = subprocess.run(["make", "--no-print-directory", "-n", "lab"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    assert "jupyter lab" in recipe and "--allow-root" in recipe, recipe


def test_make_lab_starts_serves_a_notebook_and_stops(tmp_path):
    if subprocess.run(["make", "-q", "env"], cwd=ROOT).returncode != 0:
        pytest.skip("the .venv is out of date with the pins: run `make env` first")
    port, token = free_port(), secrets.token_hex(16)
    args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} "
            f"--ServerApp.port_retries=0 --IdentityProvider.token={token}")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config")}    # no user config changes the result
    log = (tmp_path / "lab.log").open("w")
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(["make", "--no-print-directory", "lab", f"LAB_ARGS={args}"],
                               cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, status, body = time.monotonic() + START_TIMEOUT, 0, b""
        while time.monotonic() < deadline and process.poll() is None:
            status, body = get(f"{base}/api/contents/{NOTEBOOK}", token)
            if status:
                break
            time.sleep(0.5)
        output = (tmp_path / "lab.log").read_text()
        assert process.poll() is None, \
            f"`make lab` exited ({process.returncode}):\n{output[-3000:]}"
        assert status == 200, f"{NOTEBOOK}: HTTP {status} after {START_TIMEOUT} s\n{output[-3000:]}"
        model = json.loads(body)
        assert (model["type"], model["path"]) == ("notebook", NOTEBOOK)
        cells = model["content"]["cells"]
        assert cells and any(cell["cell_type"] == "code" for cell in cells)
        assert get(f"{base}/api/contents/{NOTEBOOK}", "wrong-token")[0] == 403, \
            "the server answered without its token"
        start = time.monotonic()
        assert get(f"{base}/api/shutdown", token, method="POST")[0] == 200
        process.wait(timeout=STOP_TIMEOUT)
        assert time.monotonic() - start < STOP_TIMEOUT
    finally:
        stop(process)
        log.close()

import json
import os
import subprocess
import sys
import textwrap
import urllib.request

import labserve
from labserve.testing import plugin


class Echo(labserve.Runnable):
    @labserve.method(batchable=True, max_batch_size=8, max_latency_ms=1)
    def predict(self, x):
        return x


def _post(url, body):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as reply:
        return json.loads(reply.read())


def test_the_entry_point_loads_the_plugin(pytestconfig):
    assert pytestconfig.pluginmanager.is_registered(plugin)


def test_labserve_serve_serves_a_runner_on_a_free_loopback_port(labserve_serve, labserve_runner):
    runner = labserve_runner(Echo, name="echo")
    server = labserve_serve(runner)
    assert server.host == "127.0.0.1" and server.port > 0
    assert _post(server.url + "/runners/echo/predict", b"[[1, 2]]") == [[1, 2]]


def test_labserve_serve_builds_a_runner_for_a_runnable(labserve_serve):
    server = labserve_serve(Echo())
    assert _post(server.url + "/runners/echo/predict", b"[[3]]") == [[3]]


def test_fixtures_stop_what_they_made_after_the_test(tmp_path):
    # Run a small suite in a fresh pytest: the entry point must load the plugin there too,
    # and the second test sees the first test's server and runner stopped.
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import urllib.error, urllib.request
            import labserve
            import pytest

            made = {}

            class Echo(labserve.Runnable):
                @labserve.method(batchable=True)
                def predict(self, x):
                    return x

            def test_serve(labserve_serve, labserve_runner):
                made["runner"] = labserve_runner(Echo, name="echo")
                made["server"] = labserve_serve(made["runner"])
                urllib.request.urlopen(made["server"].url + "/healthz", timeout=10).close()

            def test_then_stopped():
                assert made["runner"].stopped
                with pytest.raises(urllib.error.URLError):
                    urllib.request.urlopen(made["server"].url + "/healthz", timeout=5)
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout

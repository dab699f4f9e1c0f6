"""Fixtures shared across test folders: the fake backend, and an S3-compatible server in this process.

Tests marked `gpu` run only where CUDA is present (skipped with the reason elsewhere). Tests marked `slow`
(a real model) or `heavy` (worker processes, compiles, timed latencies) use every core, so under xdist they
take turns (`_one_heavy_test_at_a_time`) while the other worker runs the light tests.
The seeded fake backend (`--backend dummy`, extract/backends/dummy.py) is registered for every test
(`pytest_configure`); users' walla extract does not offer it. The S3 server is moto's, loopback only:

    def test_x(s3_store):            # "s3://walla-test-<random>/store", an empty bucket
        ...

The server runs on 127.0.0.1 in a thread; AWS_ENDPOINT_URL (read by botocore, hence s3fs and zarr's
FsspecStore) points at it for the whole session, so child processes (Ray workers) see it too.
Skipped, with the reason, when the optional `s3` extra (s3fs, moto[server]) is not installed.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

import pytest
import torch
from filelock import FileLock
from walla.extract.backends.dummy import DUMMY
from walla.extract.backends.registry import register_backend


def pytest_configure(config):
    register_backend(DUMMY)


def pytest_collection_modifyitems(config, items):
    """`slow` and `heavy` tests first (in their order), so xdist's worksteal hands them all to the first worker,
    which runs them one after another while the other takes light tests (and steals light ones from the end):
    none waits for the turn-taking lock below while the other holds it. `@pytest.mark.gpu` tests run wherever
    CUDA is present; elsewhere (CI) they are skipped, saying why."""
    items[:] = sorted(
        items, key=lambda item: not _is_heavy(item)
    )  # stable: a module's heavy tests stay together
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _is_heavy(item) -> bool:
    return any(item.get_closest_marker(m) for m in ("slow", "heavy"))


@pytest.fixture(autouse=True)
def _one_heavy_test_at_a_time(request, tmp_path_factory):
    """Two all-core tests at once on a 2-core machine oversubscribe torch's threads: the four real-model
    tests took 221 s two at a time and 171 s one after the other. Under xdist the workers share
    getbasetemp()'s parent, so a lock file there lets one `slow` or `heavy` test run at a time."""
    if not _is_heavy(request.node) or not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    with FileLock(tmp_path_factory.getbasetemp().parent / "heavy-tests.lock"):
        yield


@pytest.fixture(scope="session")
def s3_server():
    pytest.importorskip("s3fs", reason="remote stores need the s3 extra: pip install 'walla[s3]'")
    pytest.importorskip("moto.server", reason="the S3 test server needs moto[server] (the dev extra)")
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:  # a free loopback port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not one line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env["AWS_ENDPOINT_URL"]
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_store(s3_server) -> str:
    """A fresh bucket on the test server; returns the store URL inside it."""
    import s3fs

    bucket = f"walla-test-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    return f"s3://{bucket}/store"

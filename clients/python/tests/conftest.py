"""The tests talk to a real `lockstep serve`: LOCKSTEP_API_URL and
LOCKSTEP_API_KEY name it and a tenant's token. `npm test` starts one and runs
these tests through test/integration/python-sdk.test.ts."""

import os
import time

import pytest


@pytest.fixture(scope="session")
def conn():
    url = os.environ.get("LOCKSTEP_API_URL")
    key = os.environ.get("LOCKSTEP_API_KEY")
    if not url or not key:
        reason = "set LOCKSTEP_API_URL and LOCKSTEP_API_KEY to a running `lockstep serve` and a tenant token (npm test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return {"api_url": url, "api_key": key}


@pytest.fixture(scope="session")
def disk_quota_conn(conn):
    """A tenant with maxDiskMb 7000: a sandbox (2048 MiB by default) and two forks fit, a third does not."""
    key = os.environ.get("LOCKSTEP_API_KEY_DISK_QUOTA")
    if not key:
        reason = "set LOCKSTEP_API_KEY_DISK_QUOTA to the token of a tenant with maxDiskMb 7000 (npm test does)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return {"api_url": conn["api_url"], "api_key": key}


def eventually(fn, timeout=10.0, step=0.05):
    """Polls fn until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:  # the condition may raise until it holds
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {last!r}")
        time.sleep(step)

"""The unit tier builds no network: a case here that reaches Mininet's build, or the harness's
network start, fails at once (its place is ``tests/e2e``). Its loopback runs fork from one
zygote for the whole session (:func:`testbed.loopback.shared_zygote`)."""

from __future__ import annotations

import pytest
from mininet.net import Mininet

from testbed import loopback
from testbed.network import Network


def _refuse(*args, **kwargs):
    raise AssertionError("a unit case built a network: move it to tests/e2e")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    monkeypatch.setattr(Mininet, "build", _refuse)
    monkeypatch.setattr(Network, "start", _refuse)


@pytest.fixture(scope="session", autouse=True)
def _one_loopback_zygote():
    with loopback.shared_zygote():
        yield

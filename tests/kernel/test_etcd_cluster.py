"""The failover harness's etcd is ready only once its cluster version is
decided: Patroni reads ``/version`` once, and a cluster still at its
starting 3.0.0 sends it to ``/v3alpha``, which etcd 3.4 answers 404 for
ever (CI once waited 120 s for a leader that way)."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from pathlib import Path

import pytest

from bench.patroni import Etcd, cluster_version_decided


@pytest.mark.parametrize(
    ("version", "decided"),
    [
        ({"etcdserver": "3.4.23", "etcdcluster": "3.0.0"}, False),
        ({"etcdserver": "3.4.23", "etcdcluster": "not_decided"}, False),
        ({"etcdserver": "3.4.23", "etcdcluster": "3.4.0"}, True),
        ({"etcdserver": "3.5.9", "etcdcluster": "3.5.0"}, True),
        ({}, False),
    ],
)
def test_a_cluster_is_ready_at_its_servers_minor_version(version, decided):
    assert cluster_version_decided(version) is decided


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("etcd"), reason="needs etcd (apt-get install etcd-server)")
def test_started_etcd_tells_patroni_the_v3_api():
    with tempfile.TemporaryDirectory() as workdir:
        etcd = Etcd(Path(workdir))
        try:
            etcd.start()
            for port in etcd.client_ports.values():
                url = f"http://127.0.0.1:{port}/version"
                with urllib.request.urlopen(url, timeout=2) as answer:
                    cluster = json.load(answer)["etcdcluster"]
                assert tuple(int(x) for x in cluster.split(".")[:2]) >= (3, 4), cluster
        finally:
            etcd.stop()

"""The broker's KeyStore: the cluster key, the bootstrap admin and the ACL's
users, in that order, and what each authenticates as."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledgermq.broker.config import BrokerConfigError, Peer, parse_config
from ledgermq.broker.keys import BrokerKeys, BrokerSecurity
from ledgermq.wire.auth import CLUSTER_KEY, Principal, write_secret_file

CLUSTER, ADMIN, USER = b"c" * 32, b"a" * 32, b"u" * 32


def test_cluster_admin_and_users() -> None:
    users = {"alice": (USER, Principal("alice")),
             "mallory": (USER, Principal("mallory", cluster_member=True)),
             "admin": (USER, Principal("admin-impostor"))}
    keys = BrokerKeys(CLUSTER, admin_access_key="admin", admin_secret=ADMIN,
                      users=users.get)
    assert keys.lookup(CLUSTER_KEY) == (CLUSTER, Principal(CLUSTER_KEY, True, True))
    assert keys.lookup("admin") == (ADMIN, Principal("admin", admin=True))
    assert keys.lookup("alice") == (USER, Principal("alice"))
    assert keys.lookup("mallory") is None  # a user never becomes a cluster member
    assert keys.lookup("nobody") is None
    assert BrokerKeys(CLUSTER).lookup("admin") is None  # no admin secret: no admin key


def _config(tmp_path: Path, **values: object):
    return parse_config({"group": "g", "node_id": 1, "data_dir": str(tmp_path),
                         "peers": {"1": {"raft": "127.0.0.1:1", "client": "127.0.0.1:2"}},
                         **values})


def test_security_from_config(tmp_path: Path) -> None:
    assert _config(tmp_path).peers[1] == Peer("127.0.0.1:1", "127.0.0.1:2")
    open_ = BrokerSecurity.load(_config(tmp_path))
    assert open_.keys is None and open_.cluster is None
    write_secret_file(tmp_path / "c", CLUSTER)
    write_secret_file(tmp_path / "a", ADMIN)
    secured = BrokerSecurity.load(_config(tmp_path, cluster_secret_file=str(tmp_path / "c"),
                                          admin_secret_file=str(tmp_path / "a"),
                                          listen="0.0.0.0:2"))
    assert secured.keys is not None and secured.keys.lookup("admin") is not None
    assert secured.cluster is not None and secured.cluster.secret == CLUSTER
    with pytest.raises(BrokerConfigError, match="needs cluster_secret_file"):
        BrokerSecurity.load(_config(tmp_path, admin_secret_file=str(tmp_path / "a")))
    with pytest.raises(BrokerConfigError, match=r"client port on 0\.0\.0\.0"):
        BrokerSecurity.load(_config(tmp_path, listen="0.0.0.0:2"))
    with pytest.raises(BrokerConfigError, match="cluster_secret_file: cannot read"):
        BrokerSecurity.load(_config(tmp_path, cluster_secret_file=str(tmp_path / "none")))

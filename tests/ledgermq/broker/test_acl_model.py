"""The ACL model (ledgermq/broker/acl.py): `Acl.authorize` decided case by
case and by property (deny by default), and the replicated state machine's
ACL operations, including their replay onto a fresh replica."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commitlog import KIND_CONTROL, Entry
from ledgermq.base.errors import NoPermissionError, UnauthenticatedError
from ledgermq.broker.acl import Acl, AclError, Action, Perm, User, parse_perm, peer_host
from ledgermq.broker.control import (
    acl_grant,
    acl_revoke,
    acl_user_delete,
    acl_user_put,
    encode_control,
)
from ledgermq.broker.keys import BrokerKeys
from ledgermq.broker.state import BrokerState
from ledgermq.wire.auth import ANONYMOUS, CLUSTER_KEY, Principal

SECRET = b"s" * 32
IP = "10.1.2.3"


def acl_of(*users: User) -> Acl:
    acl = Acl()
    for user in users:
        acl.put(user)
    return acl


def user(key: str = "alice", **fields: object) -> User:
    return User.from_record({"access_key": key, "secret": SECRET, **fields})


def denied(acl: Acl, principal: Principal | None, action: Action, topic: str | None = None,
           group: str | None = None, ip: str = IP) -> str:
    """The NoPermissionError message of a refused decision (fails if allowed)."""
    with pytest.raises(NoPermissionError) as info:
        acl.authorize(principal, ip, action, topic, group)
    return info.value.message


ALICE = Principal("alice")

# ------------------------------------------------------------------ decide


def test_no_principal_is_unauthenticated() -> None:
    with pytest.raises(UnauthenticatedError):
        Acl().authorize(None, IP, Action.ANY)


def test_cluster_members_and_the_bootstrap_admin_may_do_everything() -> None:
    acl = acl_of(user(allow=["192.168.0.0/16"]))
    for principal in (Principal(CLUSTER_KEY, cluster_member=True), Principal("root", admin=True)):
        for action in Action:
            acl.authorize(principal, "203.0.113.9", action, "t", "g")


def test_an_unknown_principal_is_denied_everything_but_nothing_is_assumed() -> None:
    acl = acl_of(user(topics={"*": "PUB|SUB"}, groups={"*": "SUB"}))
    for principal in (ANONYMOUS, Principal("mallory")):
        for action in Action:
            assert "is not an ACL user" in denied(acl, principal, action, "t", "g")


def test_topic_grants_name_the_missing_permission() -> None:
    acl = acl_of(user(topics={"orders": "PUB", "audit": "SUB", "both": "PUB|SUB",
                              "secret": "DENY"}))
    acl.authorize(ALICE, IP, Action.PUB, "orders")
    acl.authorize(ALICE, IP, Action.SUB, "audit")
    acl.authorize(ALICE, IP, Action.PUB, "both")
    acl.authorize(ALICE, IP, Action.SUB, "both")
    assert denied(acl, ALICE, Action.SUB, "orders") == "user 'alice' lacks SUB on topic 'orders'"
    assert denied(acl, ALICE, Action.PUB, "audit") == "user 'alice' lacks PUB on topic 'audit'"
    assert "lacks PUB on topic 'secret'" in denied(acl, ALICE, Action.PUB, "secret")
    assert "lacks SUB on topic 'other'" in denied(acl, ALICE, Action.SUB, "other")


def test_an_exact_grant_beats_the_star_grant_both_ways() -> None:
    acl = acl_of(user(topics={"*": "PUB|SUB", "payroll": "DENY", "logs": "SUB"}))
    acl.authorize(ALICE, IP, Action.PUB, "anything")
    denied(acl, ALICE, Action.SUB, "payroll")
    denied(acl, ALICE, Action.PUB, "logs")
    acl.authorize(ALICE, IP, Action.SUB, "logs")
    narrow = acl_of(user(topics={"*": "DENY", "one": "PUB"}))
    narrow.authorize(ALICE, IP, Action.PUB, "one")
    denied(narrow, ALICE, Action.PUB, "two")


def test_group_grants_and_combined_topic_and_group_checks() -> None:
    acl = acl_of(user(topics={"t": "SUB"}, groups={"g": "SUB", "*": "DENY"}))
    acl.authorize(ALICE, IP, Action.SUB, "t", "g")
    assert denied(acl, ALICE, Action.SUB, "t", "h") == \
        "user 'alice' lacks SUB on consumer group 'h'"
    assert "on topic 'u'" in denied(acl, ALICE, Action.SUB, "u", "g")
    acl.authorize(ALICE, IP, Action.SUB, group="g")
    star = acl_of(user(groups={"*": "SUB", "ops": "DENY"}))
    star.authorize(ALICE, IP, Action.SUB, group="any")
    denied(star, ALICE, Action.SUB, group="ops")


def test_admin_actions_need_the_admin_flag_and_any_needs_only_a_user() -> None:
    acl = acl_of(user(topics={"*": "PUB|SUB"}, groups={"*": "SUB"}), user("root", admin=True))
    assert denied(acl, ALICE, Action.ADMIN) == \
        "user 'alice' lacks ADMIN (an administrator's permission)"
    acl.authorize(ALICE, IP, Action.ANY)
    for action in Action:
        acl.authorize(Principal("root"), IP, action, "t", "g")


def test_the_record_not_the_principal_decides_for_a_user() -> None:
    # A user demoted (or deleted) after it authenticated loses its rights on
    # its open connection: the principal's flag is only what AUTH saw.
    acl = acl_of(user())
    denied(acl, Principal("alice", admin=True), Action.ADMIN)
    acl.delete("alice")
    assert "is not an ACL user" in denied(acl, ALICE, Action.ANY)


def test_the_ip_allow_list_applies_to_users_admins_included() -> None:
    acl = acl_of(user(topics={"*": "PUB"}, allow=["10.0.0.0/8", "2001:db8::/32"]),
                 user("root", admin=True, allow=["127.0.0.1"]))
    acl.authorize(ALICE, "10.200.0.1", Action.PUB, "t")
    acl.authorize(ALICE, "2001:db8::5", Action.PUB, "t")
    acl.authorize(ALICE, "::ffff:10.9.9.9", Action.PUB, "t")  # IPv4-mapped
    assert denied(acl, ALICE, Action.PUB, "t", ip="192.168.1.1") == \
        "user 'alice' may not connect from 192.168.1.1 (its IP allow-list)"
    denied(acl, ALICE, Action.ANY, ip="not-an-ip")
    acl.authorize(Principal("root"), "127.0.0.1", Action.ADMIN)
    denied(acl, Principal("root"), Action.ADMIN, ip="10.0.0.1")


def test_refusals_carry_the_permission_in_their_data() -> None:
    acl = acl_of(user())
    with pytest.raises(NoPermissionError) as info:
        acl.authorize(ALICE, IP, Action.PUB, "t")
    assert info.value.data == {"permission": "PUB", "topic": "t"}


_names = st.from_regex(r"[a-z]{1,6}", fullmatch=True)
_topic_perm = st.sampled_from(["PUB", "SUB", "PUB|SUB", "DENY"])


@settings(max_examples=300, deadline=None)
@given(topics=st.dictionaries(_names, _topic_perm, max_size=6),
       groups=st.dictionaries(_names, st.sampled_from(["SUB", "DENY"]), max_size=6),
       topic=_names, group=_names, action=st.sampled_from([Action.PUB, Action.SUB]))
def test_deny_by_default(topics: dict[str, str], groups: dict[str, str], topic: str,
                         group: str, action: Action) -> None:
    """Whatever other grants a user holds, a topic or group it holds no grant
    for (and no "*" grant) is refused, and so is ADMIN without the flag."""
    topics.pop(topic, None)
    groups.pop(group, None)
    acl = acl_of(user(topics=topics, groups=groups))
    denied(acl, ALICE, action, topic)
    denied(acl, ALICE, Action.SUB, group=group)
    denied(acl, ALICE, Action.ADMIN)
    denied(acl, ALICE, action, topic, group)


@settings(max_examples=300, deadline=None)
@given(grant=_topic_perm, action=st.sampled_from([Action.PUB, Action.SUB]), topic=_names)
def test_allowed_exactly_when_granted(grant: str, action: Action, topic: str) -> None:
    acl = acl_of(user(topics={topic: grant}))
    if action.value in grant.split("|"):
        acl.authorize(ALICE, IP, action, topic)
    else:
        denied(acl, ALICE, action, topic)


# ---------------------------------------------------------------- records


def test_user_records_are_validated() -> None:
    bad: list[dict[str, object]] = [
        {"access_key": "", "secret": SECRET},
        {"access_key": "a b", "secret": SECRET},
        {"access_key": CLUSTER_KEY, "secret": SECRET},
        {"access_key": "x" * 129, "secret": SECRET},
        {"access_key": "bob", "secret": b"short"},
        {"access_key": "bob", "secret": "text, not bytes" * 4},
        {"access_key": "bob"},
        {"access_key": "bob", "secret": SECRET, "admin": "yes"},
        {"access_key": "bob", "secret": SECRET, "allow": ["10.0.0.0/33"]},
        {"access_key": "bob", "secret": SECRET, "allow": "10.0.0.0/8"},
        {"access_key": "bob", "secret": SECRET, "topics": {"t": "ALL"}},
        {"access_key": "bob", "secret": SECRET, "topics": {"../etc": "PUB"}},
        {"access_key": "bob", "secret": SECRET, "topics": ["t"]},
        {"access_key": "bob", "secret": SECRET, "groups": {"g": "PUB"}},
        {"access_key": "bob", "secret": SECRET, "groups": {"g h": "SUB"}},
        # Names are matched whole: a final newline made another user or group.
        {"access_key": "bob\n", "secret": SECRET},
        {"access_key": "bob", "secret": SECRET, "topics": {"t\n": "PUB"}},
        {"access_key": "bob", "secret": SECRET, "groups": {"g\n": "SUB"}},
    ]
    for record in bad:
        with pytest.raises(AclError):
            User.from_record(record)
    with pytest.raises(AclError):
        parse_perm("PUB", group=True)
    assert parse_perm("pub|sub") == Perm.PUB | Perm.SUB


def test_a_recorded_grant_on_a_dotted_group_still_replays() -> None:
    """The state machine's rule is unchanged (entries and snapshots written
    under it replay to the same users); the request handlers refuse such a
    grant instead (test_acl_handlers)."""
    user = User.from_record({"access_key": "bob", "secret": SECRET, "groups": {"g.h": "SUB"}})
    assert user.groups == {"g.h": Perm.SUB}


def test_public_form_never_holds_the_secret() -> None:
    u = user(admin=True, allow=["10.0.0.1"], topics={"t": "SUB|PUB"}, groups={"*": "SUB"})
    assert u.to_public() == {"access_key": "alice", "admin": True, "allow": ["10.0.0.1/32"],
                             "topics": {"t": "PUB|SUB"}, "groups": {"*": "SUB"}}
    assert "secret" not in repr(u) and SECRET not in repr(u).encode()
    assert User.from_record(u.to_record()) == u


def test_peer_host() -> None:
    assert peer_host("10.0.0.1:5000") == "10.0.0.1"
    assert peer_host("::1:5000") == "::1"
    assert peer_host("[::1]:5000") == "::1"


def test_broker_keys_look_up_cluster_admin_then_replicated_users() -> None:
    state = BrokerState()
    keys = BrokerKeys(b"c" * 32, admin_access_key="root", admin_secret=b"r" * 32,
                     users=state.acl.lookup)
    assert keys.lookup(CLUSTER_KEY) == (b"c" * 32,
                                        Principal(CLUSTER_KEY, cluster_member=True, admin=True))
    assert keys.lookup("root") == (b"r" * 32, Principal("root", admin=True))
    assert keys.lookup("alice") is None
    apply_ops(state, 1, acl_user_put({"access_key": "alice", "secret": SECRET, "admin": True}))
    assert keys.lookup("alice") == (SECRET, Principal("alice", admin=True))
    apply_ops(state, 2, acl_user_delete("alice"))
    assert keys.lookup("alice") is None


# ----------------------------------------------------------- state machine


def apply_ops(state: BrokerState, index: int, *ops: dict[str, object]) -> Entry:
    entry = Entry(index, 1, KIND_CONTROL, index * 100, encode_control(list(ops)))
    state.apply(entry)
    return entry


def test_acl_operations_through_the_state_machine_and_their_replay() -> None:
    state = BrokerState()
    log = [
        apply_ops(state, 1, acl_user_put({"access_key": "alice", "secret": SECRET,
                                          "topics": {"t": "PUB"}})),
        apply_ops(state, 2, acl_grant("alice", {"u": "SUB"}, {"g": "SUB"})),
        # Replaced without a secret: the current one is kept.
        apply_ops(state, 3, acl_user_put({"access_key": "alice", "admin": False,
                                          "topics": {"t": "PUB|SUB", "u": "SUB"},
                                          "groups": {"g": "SUB", "h": "DENY"}})),
        apply_ops(state, 4, acl_revoke("alice", ["u"], ["h"])),
        apply_ops(state, 5, acl_user_put({"access_key": "bob", "secret": b"b" * 20}),
                  acl_user_delete("bob")),
        # Invalid ones are skipped the same way on every replica.
        apply_ops(state, 6, acl_user_put({"access_key": "carol"}),  # new, no secret
                  acl_grant("nobody", {"t": "PUB"}, {}),
                  acl_grant("alice", {"t": "EVERYTHING"}, {}),
                  acl_revoke("alice", "u", []),  # type: ignore[arg-type]
                  {"op": "acl.user.delete"},
                  {"op": "acl.unknown-future-op", "x": 1}),
    ]
    alice = state.acl.users["alice"]
    assert alice.secret == SECRET
    assert alice.to_public()["topics"] == {"t": "PUB|SUB"}
    assert alice.to_public()["groups"] == {"g": "SUB"}
    assert set(state.acl.users) == {"alice"}
    assert state.bad_acl_ops == 5
    # A restart replays the log: the same users, the same decisions.
    replica = BrokerState()
    for entry in log:
        replica.apply(entry)
    assert replica.acl.users == state.acl.users
    replica.acl.authorize(ALICE, IP, Action.SUB, "t", "g")
    denied(replica.acl, ALICE, Action.SUB, "u")

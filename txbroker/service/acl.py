"""Optional access control compatible with RocketMQ 4.x's plain ACL (``plain_acl.yml``).

With ``BrokerConfig.acl_file`` set, every request on the broker port passes
:func:`validate` before any processor sees it, as RocketMQ's broker runs its ACL hook before
its processors.  The rules follow RocketMQ 4.9's ``PlainPermissionManager.validate`` step by
step, so clients configured with session credentials for a RocketMQ broker behave the same:

1. a peer matching ``globalWhiteRemoteAddresses`` passes, signed or not;
2. no ``AccessKey`` → refused; an access key not in the file → refused;
3. a peer matching the account's ``whiteRemoteAddress`` passes (no signature, no permissions);
4. the ``Signature`` must equal :func:`~txbroker.remoting.signing.signature` with the
   account's secret key;
5. admin-only codes need ``admin: true``; every resource the request touches needs its
   permission (the resource's entry in ``topicPerms``/``groupPerms``, else the account's
   default, which is DENY when not set).  An admin account without any per-resource entry
   may touch everything.

Which resources a request touches is RocketMQ's ``PlainAccessValidator.parse``
(:func:`required_resources`); a group is the resource ``%RETRY%<group>``.  Requests without
resources (END_TRANSACTION, routes, GET_MAX_OFFSET and the like, txbroker's read-only admin
codes) still need a valid signature.  Differences from RocketMQ 4.9:
SEND_BATCH_MESSAGE and QUERY_CONSUMER_OFFSET are checked like SEND_MESSAGE_V2 and
UPDATE_CONSUMER_OFFSET (4.9 lets them through with a signature only); txbroker's state-changing
operator requests (TXN_DECIDE, RESUME_CHECK_HALF_MESSAGE) are admin-only; an empty group name
(the C++ client's producer UNREGISTER_CLIENT) names no resource; and a file RocketMQ would
half-accept (an unknown permission word read as DENY, a typo in a key ignored) is refused at
start with the line's meaning spelled out.

A refusal is answered as RocketMQ answers an ``AclException``: SYSTEM_ERROR with a remark
starting ``AclException:``, here naming the access key, the resource and the permission
needed; a one-way request is never answered.  A request whose credentials fail (an access key
not in the file, a bad signature) is counted against its peer's address
(:class:`~txbroker.service.auth_throttle.AuthThrottle`, the Kafka SASL policy): that address's
next refusals are answered after a back-off doubling from 0.1 s to 5 s, forgotten after a
minute without failure or at its first request that passes, and its failures are logged once a
minute with the address and the access key (never the signature).  Requests the broker sends
to clients (CHECK_TRANSACTION_STATE) are not validated.  The name-server port is not guarded
either, as RocketMQ's name server has no ACL.

The gRPC port (RocketMQ 5.x clients) takes the same decision, :func:`decide`, with its own
signature and resources (``service/grpc/auth.py``), through :meth:`AclGuard.check` and
:meth:`AclGuard.settle`: one set of accounts, one back-off per address for both ports.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NoReturn

from txbroker.remoting.bodies import HeartbeatData
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.errors import Refusal
from txbroker.remoting.headers import HeaderError
from txbroker.remoting.signing import ACCESS_KEY, SIGNATURE, signature
from txbroker.service.acl_rules import Account, AclRules, Perm, retry_topic
from txbroker.service.auth_throttle import AuthThrottle
from txbroker.service.users import Users, UsersFileError, UserSource
from txbroker.store.record import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger(__name__)

#: RocketMQ's ``Permission.ADMIN_CODE`` plus txbroker's own state-changing operator requests.
ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
    RequestCode.RESUME_CHECK_HALF_MESSAGE, RequestCode.TXN_DECIDE, RequestCode.KAFKA_TXN_ABORT,
})


def perm_text(perm: Perm) -> str:
    """A permission as the ACL file writes it, for refusal remarks."""
    if perm & Perm.DENY:
        return "DENY"
    if perm & Perm.ANY:  # a gRPC route: either will do
        return "PUB or SUB"
    return "|".join(p.name for p in (Perm.PUB, Perm.SUB) if perm & p) or "nothing"


def check_permission(needed: Perm, owned: Perm) -> bool:
    """RocketMQ's ``Permission.checkPermission``: DENY wins, ANY is PUB or SUB."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


# --- validation ------------------------------------------------------------------------------------


class AclDenied(Refusal):
    """A request the ACL refuses: SYSTEM_ERROR with remark ``AclException: <message>``, as
    RocketMQ answers an AclException.  ``credentials``: the access key or the signature was
    wrong (what a guesser gets), as opposed to a known account lacking a permission;
    ``anonymous``: the request named no access key at all.  The gRPC port answers both
    UNAUTHORIZED and anything else FORBIDDEN (``service/grpc/auth.py``)."""

    def __init__(self, message: str, *, credentials: bool = False,
                 anonymous: bool = False) -> None:
        super().__init__(ResponseCode.SYSTEM_ERROR, f"AclException: {message}")
        self.message = message
        self.credentials = credentials
        self.anonymous = anonymous


def _group(resources: dict[str, Perm], group: str | None) -> None:
    if group:
        resources[retry_topic(group)] = Perm.SUB


def _topic(resources: dict[str, Perm], topic: str | None, perm: Perm) -> None:
    if topic:
        resources[topic] = perm


def required_resources(code: int, ext: Mapping[str, str], body: bytes) -> dict[str, Perm]:
    """Resource → permission a request needs (RocketMQ's ``PlainAccessValidator.parse``).

    Raises :class:`AclDenied` when a HEART_BEAT body cannot be read (RocketMQ: AclException).
    """
    out: dict[str, Perm] = {}
    if code == RequestCode.SEND_MESSAGE:
        _topic(out, ext.get("topic"), Perm.PUB)
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        _topic(out, ext.get("b"), Perm.PUB)
    elif code == RequestCode.RECALL_MESSAGE:  # RocketMQ 5.3: PUB on the timer's topic
        _topic(out, ext.get("topic"), Perm.PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        _topic(out, ext.get("originTopic"), Perm.PUB)
        _group(out, ext.get("group"))
    elif code == RequestCode.PULL_MESSAGE:
        _topic(out, ext.get("topic"), Perm.SUB)
        _group(out, ext.get("consumerGroup"))
    elif code == RequestCode.QUERY_MESSAGE:
        _topic(out, ext.get("topic"), Perm.SUB)
    elif code == RequestCode.HEART_BEAT:
        try:
            heartbeat = HeartbeatData.decode(body)
        except HeaderError as exc:
            raise AclDenied(f"cannot read the heartbeat's groups: {exc.remark}") from None
        for consumer in heartbeat.consumer_data_set:
            _group(out, consumer.group_name)
            for sub in consumer.subscription_data_set:
                _topic(out, sub.topic, Perm.SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        _group(out, ext.get("consumerGroup"))
    elif code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUMER_OFFSET):
        _group(out, ext.get("consumerGroup"))
        _topic(out, ext.get("topic"), Perm.SUB)
    return out


def _describe(resource: str) -> str:
    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return f"group={resource[len(RETRY_GROUP_TOPIC_PREFIX):]}"
    return f"topic={resource}"


def validate(rules: AclRules, code: int, ext: Mapping[str, str], body: bytes,
             peer_host: str) -> AclDenied | None:
    """Whether a broker-port request may run: None, or the refusal to answer with.  Pure."""
    access_key = ext.get(ACCESS_KEY)

    def signed(account: Account) -> bool:
        expected = signature(account.secret_key, ext, body)
        return hmac.compare_digest(expected.encode(), ext.get(SIGNATURE, "").encode())

    return decide(rules, peer_host, access_key, signed, what=f"request code {code}",
                  admin=f"request code={code}" if code in ADMIN_CODES else None,
                  needed=lambda: required_resources(code, ext, body))


def decide(rules: AclRules, peer_host: str, access_key: str | None,
           signed: Callable[[Account], bool], *, what: str, admin: str | None,
           needed: Callable[[], dict[str, Perm]]) -> AclDenied | None:
    """The decision both RocketMQ ports take (steps 1-5 of the module docstring), whatever
    their signature covers: ``signed(account)`` tells whether the request's signature is the
    account's; ``admin``: None, or the admin-only request named for the refusal; ``needed()``: the resources it
    touches (it may raise :class:`AclDenied` for a request it cannot read).  Pure."""
    if any(p.matches(peer_host) for p in rules.global_white):
        return None
    if access_key is None:
        return AclDenied(f"No accessKey is configured ({what} from {peer_host} "
                         f"carries no AccessKey and the address is not white-listed)",
                         anonymous=True)
    account = rules.accounts.get(access_key)
    if account is None:
        return AclDenied(f"No acl config for {access_key!r}", credentials=True)
    if account.white_remote_address is not None and account.white_remote_address.matches(peer_host):
        return None
    if not signed(account):
        return AclDenied(f"Check signature failed for accessKey={access_key}", credentials=True)
    if admin is not None and not account.admin:
        return AclDenied(f"Need admin permission for {admin}, but accessKey={access_key} is not")
    try:
        resources = needed()
    except AclDenied as exc:
        return exc
    if not resources or (account.admin and not account.resource_perms):
        return None
    for resource, perm in resources.items():
        owned = account.resource_perms.get(resource)
        if owned is None:
            is_group = resource.startswith(RETRY_GROUP_TOPIC_PREFIX)
            owned = account.default_group_perm if is_group else account.default_topic_perm
        if not check_permission(perm, owned):
            return AclDenied(f"No permission for {_describe(resource)}: accessKey={access_key} "
                             f"needs {perm_text(perm)}, has {perm_text(owned)}")
    return None


class AclGuard:
    """The broker port's ``before_request`` hook: refuses (and logs) what :func:`validate` refuses.

    With a user store, its users' access keys are accounts too (``Users.acl_rules``), as the
    store has them now: a key made by ``txbroker user access-key`` works without a restart.
    """

    def __init__(self, rules: AclRules, users: UserSource | None = None) -> None:
        self.rules = rules
        self.users = users
        self.refused = 0
        #: Addresses whose credentials failed, and how long their refusals wait.
        self.throttle = AuthThrottle()
        self._merged_from: Users | None = None
        self._merged = rules
        if users is not None:  # an access key in both files stops the start (UsersFileError)
            self._merged_from = users.current()
            self._merged = self._merged_from.acl_rules(rules)

    def _rules_now(self) -> AclRules:
        if self.users is None:
            return self.rules
        users = self.users.current()
        if users is not self._merged_from:
            self._merged_from = users
            try:
                self._merged = users.acl_rules(self.rules)
            except UsersFileError as exc:
                log.error("%s; the previous users stay in force", exc)
        return self._merged

    def __call__(self, conn: Any, cmd: RemotingCommand) -> Coroutine[Any, Any, NoReturn] | None:
        """None (the request may run), or raises the refusal, or returns the coroutine that
        raises it after the address's back-off (the connection answers when it ends)."""
        peer = getattr(conn, "peer", "")
        host = peer.rpartition(":")[0] or peer
        denied = validate(self._rules_now(), cmd.code, cmd.ext_fields, cmd.body, host)
        oneway = " (one-way, not answered)" if cmd.is_oneway else ""
        delay = self.settle(denied, peer=peer, host=host, access_key=cmd.ext_fields.get(ACCESS_KEY),
                            what=f"request code {cmd.code}", note=oneway)
        if denied is None:
            return None
        if delay <= 0:
            raise denied
        return _refuse_after(delay, denied)

    def check(self, peer_host: str, access_key: str | None, signed: Callable[[Account], bool],
              *, what: str, needed: Callable[[], dict[str, Perm]]) -> AclDenied | None:
        """:func:`decide` against the rules in force now (the ACL file and the user store's
        keys), for a port whose requests carry another signature (the gRPC port)."""
        return decide(self._rules_now(), peer_host, access_key, signed, what=what, admin=None,
                      needed=needed)

    def settle(self, denied: AclDenied | None, *, peer: str, host: str,
               access_key: str | None, what: str, note: str = "") -> float:
        """Count and log a decision; the seconds to wait before answering a refusal (the
        address's back-off; 0 for a request that passed or is short of a permission only)."""
        if denied is None or (not denied.credentials and access_key is not None):
            # Passed, or signed right and short of a permission: the address holds valid
            # credentials (an unsigned request proves nothing and forgets nothing).
            self.throttle.succeeded(host)
        if denied is None:
            return 0.0
        self.refused += 1
        if not denied.credentials:
            log.warning("refused %s from %s%s: %s", what, peer, note, denied.remark)
            return 0.0
        delay = self.throttle.delay(host)
        if self.throttle.failed(host):
            log.warning("authentication failed from %s, access key %r, %s%s: %s "
                        "(further failures from %s are not logged for a minute)", peer,
                        access_key, what, note, denied.remark, host)
        else:
            log.debug("refused %s from %s%s: %s", what, peer, note, denied.remark)
        return delay


async def _refuse_after(delay: float, denied: AclDenied) -> NoReturn:
    await asyncio.sleep(delay)
    raise denied

"""Kafka ACLs on every Kafka API: one authorization step in front of each handler
(docs/security.md, "Kafka ACLs", has the per-API table).

:func:`authorize_handlers` wraps each handler with the rule of its API, in the way Kafka's
``KafkaApis`` checks it: a resource the principal may not use is answered with Kafka's error
code for its kind (TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED,
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED) and never reaches the
handler, so nothing is stored for it; the rest of the request is handled as usual and the two
answers are merged.  The broker wraps only when Kafka SASL is on (a connection without
authentication has no principal to check), so the hot path of an open broker is untouched.

Requests between brokers of a cluster (forwarded admin requests, transaction markers) come
over a connection logged in as the cluster's own account (``User:txbroker-cluster``,
``peer_auth.py``), a super user: only a holder of the cluster secret can log in as it.  Their
envelope (``peer_envelope.py``) says what to act on, never whom to trust: a request claiming
to be a broker's is authorized as the user it logged in as, like any other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from txbroker.remoting.kafka.apis import ApiKey
from txbroker.remoting.kafka.errors import ErrorCode
from txbroker.service.kafka.acls import AclOperation, Authorizer, ResourceType
from txbroker.service.kafka.context import Handler, KafkaRequestContext
from txbroker.service.kafka.peer_auth import CLUSTER_PRINCIPAL
from txbroker.service.kafka.shapes import SHAPES

Op = AclOperation
TOPIC, GROUP, TXN, CLUSTER = (ResourceType.TOPIC, ResourceType.GROUP,
                              ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER)
TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
TXN_DENIED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
#: Kafka's ConfigResource types in Describe/AlterConfigs: a topic; anything else (a broker,
#: a broker logger) is authorized on the cluster.
CONFIG_TOPIC = 2

#: APIs with no ACL check: before or about authentication.
UNCHECKED = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                       ApiKey.DESCRIBE_CLUSTER})


@dataclass(slots=True)
class Check:
    """One request's questions to the authorizer."""

    authorizer: Authorizer
    principal: str
    host: str

    def __call__(self, op: AclOperation, kind: ResourceType, name: str) -> bool:
        return self.authorizer.allowed(self.principal, self.host, op, kind, name)

    def cluster(self, op: AclOperation) -> bool:
        return self.authorizer.cluster(self.principal, self.host, op)


Rule = Callable[[Check, Handler, KafkaRequestContext, dict], Awaitable[dict | None]]


# --- requests whose topics carry partitions --------------------------------------------------

async def per_topic(api: ApiKey, handler: Handler, ctx: KafkaRequestContext, body: dict,
                    allowed: Callable[[str], bool], code: int = TOPIC_DENIED) -> dict | None:
    """Topics ``allowed`` refuses are answered ``code`` per partition; the handler gets the
    others (it is not called when none is left) and the two answers are merged."""
    shape = SHAPES[api]
    topics = body.get(shape.req_topics) or ()
    kept = [t for t in topics if allowed(t[shape.req_name])]
    if len(kept) == len(topics):
        return await handler(ctx, body)
    refused = shape.refused_topics([t for t in topics if t not in kept], code)
    answer: dict | None = await handler(ctx, {**body, shape.req_topics: kept}) if kept else {}
    if answer is None:  # Produce acks=0: no answer either way
        return None
    return {**answer, shape.resp_topics: [*(answer.get(shape.resp_topics) or ()), *refused]}


# --- the rules --------------------------------------------------------------------------------

async def produce(check: Check, handler: Handler, ctx: KafkaRequestContext,
                  body: dict) -> dict | None:
    tid = body.get("transactional_id")
    if tid is not None and not check(Op.WRITE, TXN, tid):
        return None if body.get("acks") == 0 else \
            SHAPES[ApiKey.PRODUCE].refuse_all(body, TXN_DENIED, throttle_time_ms=0)
    return await per_topic(ApiKey.PRODUCE, handler, ctx, body,
                           lambda t: check(Op.WRITE, TOPIC, t))


def _topics_rule(api: ApiKey, op: AclOperation) -> Rule:
    async def rule(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
        return await per_topic(api, handler, ctx, body, lambda t: check(op, TOPIC, t))
    return rule


async def metadata(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
    """DESCRIBE per topic: a named topic refused is TOPIC_AUTHORIZATION_FAILED, a topic the
    principal may not describe is left out of an all-topics answer; a topic is created for
    the request only with CREATE on the cluster or on the topic."""
    requested = body.get("topics")
    every = requested is None or (ctx.api_version == 0 and not requested)
    names = [] if every else [t["name"] for t in requested]
    kept = [n for n in names if check(Op.DESCRIBE, TOPIC, n)]
    inner = dict(body)
    if not every:
        inner["topics"] = [{"name": n} for n in kept]
        if body.get("allow_auto_topic_creation", True) and not check.cluster(Op.CREATE) \
                and not all(check(Op.CREATE, TOPIC, n) for n in kept):
            inner["allow_auto_topic_creation"] = False
    answer = await handler(ctx, inner) or {}
    wanted = set(kept)
    topics = [t for t in answer.get("topics") or ()
              if (t["name"] in wanted if not every else check(Op.DESCRIBE, TOPIC, t["name"]))]
    topics += [{"error_code": TOPIC_DENIED, "name": n, "is_internal": False, "partitions": []}
               for n in names if n not in wanted]
    return {**answer, "topics": topics}


async def offset_commit(check: Check, handler: Handler, ctx: KafkaRequestContext,
                        body: dict) -> dict | None:
    if not check(Op.READ, GROUP, body["group_id"]):
        return SHAPES[ApiKey.OFFSET_COMMIT].refuse_all(body, GROUP_DENIED)
    return await per_topic(ApiKey.OFFSET_COMMIT, handler, ctx, body,
                           lambda t: check(Op.READ, TOPIC, t))


async def offset_fetch(check: Check, handler: Handler, ctx: KafkaRequestContext,
                       body: dict) -> dict | None:
    if not check(Op.READ, GROUP, body["group_id"]):
        return SHAPES[ApiKey.OFFSET_FETCH].refuse_all(body, GROUP_DENIED, error_code=GROUP_DENIED)
    if body.get("topics") is None:  # every committed offset: those of described topics
        answer = await handler(ctx, body) or {}
        return {**answer, "topics": [t for t in answer.get("topics") or ()
                                     if check(Op.DESCRIBE, TOPIC, t["name"])]}
    return await per_topic(ApiKey.OFFSET_FETCH, handler, ctx, body,
                           lambda t: check(Op.DESCRIBE, TOPIC, t))


def _group_rule(op: AclOperation, **refusal: Any) -> Rule:
    """A request about one group (``group_id``): ``op`` on it or the refusal."""
    async def rule(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
        if not check(op, GROUP, body["group_id"]):
            return {"error_code": GROUP_DENIED, **refusal}
        return await handler(ctx, body)
    return rule


async def find_coordinator(check: Check, handler: Handler, ctx: KafkaRequestContext,
                           body: dict) -> dict | None:
    is_txn = body.get("key_type", 0) == 1
    if not check(Op.DESCRIBE, TXN if is_txn else GROUP, body["key"]):
        return {"throttle_time_ms": 0, "error_code": TXN_DENIED if is_txn else GROUP_DENIED,
                "error_message": "not authorized", "node_id": -1, "host": "", "port": -1}
    return await handler(ctx, body)


def _listed(key: str, item: str, kind: ResourceType, op: AclOperation, code: int,
            refusal: Callable[[str], dict], answer_key: str, on_cluster: bool = False) -> Rule:
    """A request naming several resources (``body[key]``, each ``item`` or a bare name):
    those refused answered by ``refusal``, the rest handled.  ``on_cluster``: ``op`` on the
    cluster allows them all (CreateTopics, as Kafka)."""
    async def rule(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
        if on_cluster and check.cluster(op):
            return await handler(ctx, body)
        entries = body.get(key) or ()
        name = (lambda e: e) if not item else (lambda e: e[item])
        kept = [e for e in entries if check(op, kind, name(e))]
        if len(kept) == len(entries):
            return await handler(ctx, body)
        answer = await handler(ctx, {**body, key: kept}) if kept else {}
        refused = [{**refusal(name(e)), "error_code": int(code)}
                   for e in entries if e not in kept]
        return {"throttle_time_ms": 0, **(answer or {}),
                answer_key: [*((answer or {}).get(answer_key) or ()), *refused]}
    return rule


def _filtered(answer_key: str, name_key: str, kind: ResourceType, op: AclOperation,
              everything: AclOperation | None = None) -> Rule:
    """A listing: entries the principal may not ``op`` are left out (none with ``everything``
    on the cluster)."""
    async def rule(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
        answer = await handler(ctx, body) or {}
        if everything is not None and check.cluster(everything):
            return answer
        return {**answer, answer_key: [e for e in answer.get(answer_key) or ()
                                       if check(op, kind, e[name_key])]}
    return rule


async def init_producer_id(check: Check, handler: Handler, ctx: KafkaRequestContext,
                           body: dict) -> dict | None:
    """A transactional producer needs WRITE on its id; an idempotent one IDEMPOTENT_WRITE on
    the cluster or WRITE on some topic (KIP-679)."""
    tid = body.get("transactional_id")
    if tid is not None:
        if not check(Op.WRITE, TXN, tid):
            return {"error_code": TXN_DENIED, "producer_id": -1, "producer_epoch": -1}
    elif not check.cluster(Op.IDEMPOTENT_WRITE) \
            and not check.authorizer.allowed_any(check.principal, check.host, Op.WRITE, TOPIC):
        return {"error_code": CLUSTER_DENIED, "producer_id": -1, "producer_epoch": -1}
    return await handler(ctx, body)


def _txn_rule(then: Rule | None = None, **refusal: Any) -> Rule:
    """WRITE on the request's transactional id first (else ``refusal`` with
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then ``then``."""
    async def rule(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
        if not check(Op.WRITE, TXN, body["transactional_id"]):
            return {"error_code": TXN_DENIED, **refusal}
        return await (then or _handled)(check, handler, ctx, body)
    return rule


async def _handled(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
    return await handler(ctx, body)


async def add_partitions(check: Check, handler: Handler, ctx: KafkaRequestContext,
                         body: dict) -> dict | None:
    """As Kafka: one topic refused and no partition is added; the others are answered
    OPERATION_NOT_ATTEMPTED."""
    api = ApiKey.ADD_PARTITIONS_TO_TXN
    if not check(Op.WRITE, TXN, body["transactional_id"]):
        return SHAPES[api].refuse_all(body, TXN_DENIED)
    topics = body.get("topics") or ()
    refused = [t for t in topics if not check(Op.WRITE, TOPIC, t["name"])]
    if not refused:
        return await handler(ctx, body)
    shape = SHAPES[api]
    return {"results": [*shape.refused_topics(refused, TOPIC_DENIED),
                        *shape.refused_topics([t for t in topics if t not in refused],
                                              ErrorCode.OPERATION_NOT_ATTEMPTED)]}


async def _offsets_group(check: Check, handler: Handler, ctx: KafkaRequestContext,
                         body: dict) -> dict | None:
    if not check(Op.READ, GROUP, body["group_id"]):
        return {"error_code": GROUP_DENIED}
    return await handler(ctx, body)


async def txn_offset_commit(check: Check, handler: Handler, ctx: KafkaRequestContext,
                            body: dict) -> dict | None:
    """WRITE on the transactional id, READ on the group, READ on each topic; refused per
    partition."""
    if not check(Op.WRITE, TXN, body["transactional_id"]):
        return SHAPES[ApiKey.TXN_OFFSET_COMMIT].refuse_all(body, TXN_DENIED)
    if not check(Op.READ, GROUP, body["group_id"]):
        return SHAPES[ApiKey.TXN_OFFSET_COMMIT].refuse_all(body, GROUP_DENIED)
    return await per_topic(ApiKey.TXN_OFFSET_COMMIT, handler, ctx, body,
                           lambda t: check(Op.READ, TOPIC, t))


def _configs(answer_key: str, op: AclOperation) -> Rule:
    """Describe/Alter(Incremental)Configs: ``op`` on the topic, or on the cluster for a
    broker's configuration."""
    async def rule(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
        entries = body.get("resources") or ()

        def ok(r: dict) -> bool:
            if r["resource_type"] == CONFIG_TOPIC:
                return check(op, TOPIC, r["resource_name"])
            return check.cluster(op)
        kept = [r for r in entries if ok(r)]
        if len(kept) == len(entries):
            return await handler(ctx, body)
        answer = (await handler(ctx, {**body, "resources": kept}) if kept else None) or {}
        refused = [{"error_code": int(TOPIC_DENIED if r["resource_type"] == CONFIG_TOPIC
                                      else CLUSTER_DENIED),
                    "error_message": "not authorized", "resource_type": r["resource_type"],
                    "resource_name": r["resource_name"], "configs": []}
                   for r in entries if r not in kept]
        return {"throttle_time_ms": 0, **answer,
                answer_key: [*(answer.get(answer_key) or ()), *refused]}
    return rule


def _cluster_rule(op: AclOperation, refusal: Callable[[dict], dict]) -> Rule:
    async def rule(check: Check, handler: Handler, ctx: KafkaRequestContext,
                   body: dict) -> dict | None:
        if not check.cluster(op):
            return refusal(body)
        return await handler(ctx, body)
    return rule


_DENIED = {"error_message": "not authorized"}

RULES: dict[ApiKey, Rule] = {
    ApiKey.PRODUCE: produce,
    ApiKey.FETCH: _topics_rule(ApiKey.FETCH, Op.READ),
    ApiKey.LIST_OFFSETS: _topics_rule(ApiKey.LIST_OFFSETS, Op.DESCRIBE),
    ApiKey.METADATA: metadata,
    ApiKey.OFFSET_COMMIT: offset_commit,
    ApiKey.OFFSET_FETCH: offset_fetch,
    ApiKey.FIND_COORDINATOR: find_coordinator,
    ApiKey.JOIN_GROUP: _group_rule(Op.READ, generation_id=-1),
    ApiKey.SYNC_GROUP: _group_rule(Op.READ),
    ApiKey.HEARTBEAT: _group_rule(Op.READ),
    ApiKey.LEAVE_GROUP: _group_rule(Op.READ),
    ApiKey.DESCRIBE_GROUPS: _listed("groups", "", GROUP, Op.DESCRIBE, GROUP_DENIED,
                                    lambda g: {"group_id": g}, "groups"),
    ApiKey.LIST_GROUPS: _filtered("groups", "group_id", GROUP, Op.DESCRIBE, Op.DESCRIBE),
    ApiKey.DELETE_GROUPS: _listed("groups_names", "", GROUP, Op.DELETE, GROUP_DENIED,
                                  lambda g: {"group_id": g}, "results"),
    ApiKey.CREATE_TOPICS: _listed("topics", "name", TOPIC, Op.CREATE, TOPIC_DENIED,
                                  lambda t: {"name": t, **_DENIED}, "topics", on_cluster=True),
    ApiKey.DELETE_TOPICS: _listed("topic_names", "", TOPIC, Op.DELETE, TOPIC_DENIED,
                                  lambda t: {"name": t, **_DENIED}, "responses"),
    ApiKey.CREATE_PARTITIONS: _listed("topics", "name", TOPIC, Op.ALTER, TOPIC_DENIED,
                                      lambda t: {"name": t, **_DENIED}, "results"),
    ApiKey.DESCRIBE_CONFIGS: _configs("results", Op.DESCRIBE_CONFIGS),
    ApiKey.ALTER_CONFIGS: _configs("responses", Op.ALTER_CONFIGS),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _configs("responses", Op.ALTER_CONFIGS),
    ApiKey.DESCRIBE_PRODUCERS: _topics_rule(ApiKey.DESCRIBE_PRODUCERS, Op.READ),
    ApiKey.INIT_PRODUCER_ID: init_producer_id,
    ApiKey.ADD_PARTITIONS_TO_TXN: add_partitions,
    ApiKey.ADD_OFFSETS_TO_TXN: _txn_rule(_offsets_group),
    ApiKey.END_TXN: _txn_rule(),
    ApiKey.TXN_OFFSET_COMMIT: txn_offset_commit,
    ApiKey.DESCRIBE_TRANSACTIONS: _listed(
        "transactional_ids", "", TXN, Op.DESCRIBE, TXN_DENIED,
        lambda t: {"transactional_id": t, "transaction_state": "", "producer_id": -1},
        "transaction_states"),
    ApiKey.LIST_TRANSACTIONS: _filtered("transaction_states", "transactional_id", TXN,
                                        Op.DESCRIBE),
    # Only brokers send it (as Kafka, CLUSTER_ACTION on the cluster: the cluster account).
    ApiKey.WRITE_TXN_MARKERS: _cluster_rule(Op.CLUSTER_ACTION, lambda body: {"markers": [
        {"producer_id": m["producer_id"], "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": i, "error_code": CLUSTER_DENIED}
                for i in t.get("partition_indexes") or ()]} for t in m.get("topics") or ()]}
        for m in body.get("markers") or ()]}),
    ApiKey.DESCRIBE_ACLS: _cluster_rule(Op.DESCRIBE, lambda body: {
        "error_code": CLUSTER_DENIED, "error_message": "not authorized", "resources": []}),
    ApiKey.CREATE_ACLS: _cluster_rule(Op.ALTER, lambda body: {"results": [
        {"error_code": CLUSTER_DENIED, "error_message": "not authorized"}
        for _ in body.get("creations") or ()]}),
    ApiKey.DELETE_ACLS: _cluster_rule(Op.ALTER, lambda body: {"filter_results": [
        {"error_code": CLUSTER_DENIED, "error_message": "not authorized", "matching_acls": []}
        for _ in body.get("filters") or ()]}),
}


def authorize_handlers(handlers: dict[int, Handler],
                       authorizer: Callable[[], Authorizer]) -> dict[int, Handler]:
    """``handlers`` each behind its API's rule.  ``authorizer`` gives the decision in force
    now (the user store's current snapshot).  An API with neither a rule nor a place in
    :data:`UNCHECKED` is a bug: refused here rather than served unchecked."""
    missing = sorted(ApiKey(k).name for k in handlers if k not in RULES and k not in UNCHECKED)
    if missing:
        raise ValueError(f"no authorization rule for {', '.join(missing)}")
    return {k: h if k in UNCHECKED else _wrap(RULES[ApiKey(k)], h, authorizer)
            for k, h in handlers.items()}


def _wrap(rule: Rule, handler: Handler, authorizer: Callable[[], Authorizer]) -> Handler:
    async def authorized(ctx: KafkaRequestContext, body: dict) -> dict | None:
        if ctx.principal is None or ctx.principal == CLUSTER_PRINCIPAL:
            return await handler(ctx, body)
        host = ctx.peer.rpartition(":")[0]
        return await rule(Check(authorizer(), ctx.principal, host), handler, ctx, body)
    return authorized

"""Operator requests: topics, broker status and pending transactions.

What the ``txbroker topic|status|txn`` commands use, and what an operator's script can use.
Topic creation and change are RocketMQ's UPDATE_AND_CREATE_TOPIC (so RocketMQ tooling works
the same), with two checks RocketMQ's request does not make: creating an existing topic is
refused, and shrinking one whose dropped queues hold messages needs ``force``;
the status document and the transaction requests (TXN_LIST/SHOW/DECIDE, BROKER_STATUS,
KAFKA_TXN_LIST/ABORT for the Kafka listener's transactions) are txbroker's own codes in the private 9001-9099 range.  Each request goes to every broker the
name server knows (one, for a single-broker installation), so answers are per broker.

In a cluster the broker list comes from the name server's GET_BROKER_CLUSTER_INFO: topic
changes go to every group's master (or, with ``cluster``, the masters of that cluster), the
status to every broker, masters and slaves, and the transaction list to each group's master,
or its lowest slave while the group has no master (a slave holds the replicated halves).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from typing import Self

import orjson

from txbroker.client.errors import (
    BrokerError,
    ClientError,
    LocatedError,
    TopicExistsError,
    TopicNotFoundError,
    TopicShrinkError,
)
from txbroker.client.instance import DEFAULT_NAMESRV, ClientInstance
from txbroker.client.message import validate_topic
from txbroker.remoting.bodies import MASTER_ID, broker_label
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import RemotingCommand
from txbroker.remoting.headers import (
    DEFAULT_TOPIC,
    PERM_READ,
    PERM_WRITE,
    TXN_DECISIONS,
    TXN_LIST_STATES,
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    Header,
    HeaderError,
    KafkaTxnAbortRequestHeader,
    KafkaTxnListRequestHeader,
    OffsetResponseHeader,
    TxnDecideRequestHeader,
    TxnListRequestHeader,
    TxnShowRequestHeader,
)
from txbroker.remoting.tls import ClientTLS

PERM_READ_WRITE = PERM_READ | PERM_WRITE
DECISIONS = TXN_DECISIONS


class AdminClient:
    """Operator requests to every broker; ``access_key``/``secret_key`` sign them (topic
    creation and transaction decisions need an ``admin`` account when the broker runs ACL);
    ``tls`` as for :class:`~txbroker.client.producer.Producer`."""

    def __init__(self, namesrv: str = DEFAULT_NAMESRV, timeout: float = 5.0, *,
                 access_key: str | None = None, secret_key: str | None = None,
                 tls: ClientTLS | ssl.SSLContext | None = None) -> None:
        self._instance = ClientInstance(namesrv, request_timeout=timeout,
                                        access_key=access_key, secret_key=secret_key, tls=tls)

    async def start(self) -> None:
        await self._instance.start()
        if not self._instance.namesrv.groups:
            raise ClientError("the name server knows no broker")

    async def shutdown(self) -> None:
        await self._instance.shutdown()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def brokers(self) -> dict[str, str]:
        """Broker name -> master address (groups without a master now are left out)."""
        return dict(sorted(self._instance.namesrv.broker_addrs.items()))

    @property
    def clusters(self) -> dict[str, list[str]]:
        """Cluster name -> its broker names, as the name server lists them."""
        return dict(sorted(self._instance.namesrv.clusters.items()))

    def members(self) -> list[tuple[str, int, str]]:
        """Every broker as (broker name, broker id, address): masters (id 0) and slaves."""
        return sorted((name, broker_id, addr)
                      for name, ids in self._instance.namesrv.groups.items()
                      for broker_id, addr in ids.items())

    def cluster_masters(self, cluster: str) -> dict[str, str]:
        """Broker name -> master address of the groups in ``cluster``; LocatedError naming
        the name server when it lists no such cluster, or none of its groups has a master."""
        namesrv = self._instance.namesrv
        names = namesrv.clusters.get(cluster)
        if names is None:
            known = ", ".join(sorted(namesrv.clusters)) or "none"
            raise LocatedError(f"no cluster {cluster!r} (known: {known})", namesrv.addr)
        masters = {name: addr for name, addr in self.brokers.items() if name in names}
        if not masters:
            raise LocatedError(f"cluster {cluster!r} has no master now", namesrv.addr)
        return masters

    async def _call(self, addr: str, code: int, what: str, header: Header | None = None) -> RemotingCommand:
        ext = header.to_ext() if header is not None else {}
        resp = await self._instance.invoke(addr, RemotingCommand.request(code, ext))
        if resp.code != ResponseCode.SUCCESS:
            raise BrokerError(what, resp.code, resp.remark, addr)
        return resp

    @staticmethod
    def _json(resp: RemotingCommand, what: str) -> object:
        try:
            return orjson.loads(resp.body) if resp.body else None
        except orjson.JSONDecodeError as exc:
            raise ClientError(f"{what}: answer is not valid JSON: {exc}") from None

    # --- topics --------------------------------------------------------------------------
    async def create_topic(self, topic: str, queues: int = 4, *,
                           cluster: str | None = None) -> dict[str, str]:
        """Create ``topic`` with ``queues`` read and write queues on every master (with
        ``cluster``: every master of that cluster); returns broker name -> ``created`` or
        ``exists`` (left as it is).

        Without ``cluster`` a topic that exists on any broker raises
        :class:`TopicExistsError` and nothing changes: RocketMQ's UPDATE_AND_CREATE_TOPIC
        would silently redefine it (fewer queues hide the messages of the dropped ones);
        :meth:`update_topic` changes a topic.  With ``cluster`` the groups that have the topic
        keep it unchanged and the others get it (how a topic reaches a new group); only when
        every one has it is that an error.
        """
        validate_topic(topic)
        _check_queues(queues)
        targets = self.brokers if cluster is None else self.cluster_masters(cluster)
        current = await self._topic_configs(topic, targets.values())
        if current and (cluster is None or len(current) == len(targets)):
            addr, cfg = next(iter(current.items()))
            raise TopicExistsError(topic, addr, _queue_count(cfg))
        outcome = {}
        for name, addr in targets.items():
            if addr in current:
                outcome[name] = "exists"
                continue
            await self._put_topic(addr, topic, queues, queues, PERM_READ_WRITE)
            outcome[name] = "created"
        return outcome

    async def update_topic(self, topic: str, queues: int | None = None, perm: int | None = None,
                           *, force: bool = False) -> dict[str, dict]:
        """Change an existing topic's queue count and/or permission on every broker; returns
        broker address -> the new config.

        Shrinking hides the messages of the dropped queues from consumers, so it raises
        :class:`TopicShrinkError` (naming the queues and how many messages they hold) unless
        ``force``; a broker without the topic raises :class:`TopicNotFoundError`.
        """
        validate_topic(topic)
        if queues is not None:
            _check_queues(queues)
        if perm is not None and (not isinstance(perm, int) or perm & ~PERM_READ_WRITE):
            raise ValueError("perm must be a combination of 4 (read) and 2 (write)")
        current = await self._topic_configs(topic)
        for addr in self.brokers.values():
            if addr not in current:
                raise TopicNotFoundError(topic, addr)
        plans = {}
        for addr, cfg in current.items():
            read, write = int(cfg.get("readQueueNums", 0)), int(cfg.get("writeQueueNums", 0))
            new_read, new_write = (read, write) if queues is None else (queues, queues)
            old_perm = int(cfg.get("perm", PERM_READ_WRITE))
            new_perm = old_perm if perm is None else (old_perm & ~PERM_READ_WRITE) | perm
            if not force and new_read < max(read, write):
                held = await self._held(addr, topic, range(new_read, max(read, write)))
                if held:
                    raise TopicShrinkError(topic, addr, new_read, held)
            plans[addr] = (new_read, new_write, new_perm)
        for addr, (read, write, new_perm) in plans.items():
            await self._put_topic(addr, topic, read, write, new_perm)
        return await self._topic_configs(topic)

    async def _put_topic(self, addr: str, topic: str, read: int, write: int, perm: int) -> None:
        header = CreateTopicRequestHeader(topic=topic, default_topic=DEFAULT_TOPIC,
                                          read_queue_nums=read, write_queue_nums=write, perm=perm)
        await self._call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, f"create topic {topic}", header)

    async def _topic_configs(self, topic: str, addrs: Iterable[str] | None = None) -> dict[str, dict]:
        """Broker address -> ``topic``'s TopicConfig, for the brokers (of ``addrs``, default
        every master) that have it."""
        out = {}
        for addr in self.brokers.values() if addrs is None else addrs:
            table = _config_table(self._json(
                await self._call(addr, RequestCode.GET_ALL_TOPIC_CONFIG, "list topics"), "list topics"))
            if isinstance(table.get(topic), dict):
                out[addr] = table[topic]
        return out

    async def _held(self, addr: str, topic: str, queue_ids: range) -> dict[int, int]:
        """Queue id -> messages retained, for the queues of ``queue_ids`` that hold any."""
        held = {}
        for q in queue_ids:
            what = f"offsets of {topic} queue {q}"
            low, high = [await self._offset(addr, code, what, header) for code, header in (
                (RequestCode.GET_MIN_OFFSET, GetMinOffsetRequestHeader(topic=topic, queue_id=q)),
                (RequestCode.GET_MAX_OFFSET, GetMaxOffsetRequestHeader(topic=topic, queue_id=q)))]
            if high > low:
                held[q] = high - low
        return held

    async def _offset(self, addr: str, code: int, what: str, header: Header) -> int:
        try:
            return OffsetResponseHeader.from_ext((await self._call(addr, code, what, header)).ext_fields).offset
        except HeaderError as exc:
            raise ClientError(f"{what}: {exc.remark}") from None

    async def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` on every broker: its config, queues and consumer offsets."""
        validate_topic(topic)
        for addr in self.brokers.values():
            await self._call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, f"delete topic {topic}",
                             DeleteTopicRequestHeader(topic=topic))

    async def list_topics(self) -> dict[str, dict]:
        """Topic name -> RocketMQ TopicConfig (queues, perm), merged over brokers."""
        out: dict[str, dict] = {}
        for addr in self.brokers.values():
            table = _config_table(self._json(
                await self._call(addr, RequestCode.GET_ALL_TOPIC_CONFIG, "list topics"), "list topics"))
            for name, cfg in table.items():
                out.setdefault(name, cfg if isinstance(cfg, dict) else {})
        return dict(sorted(out.items()))

    # --- status --------------------------------------------------------------------------
    async def status(self) -> dict[str, dict]:
        """Broker -> its status document (topics, offsets, groups, halves, metrics) with
        ``address``, ``brokerName``, ``label`` (``name@address``, how logs name it too),
        ``brokerId``, ``role``, ``epoch`` and ``inSyncReplicas`` added; a group's master
        (id 0 at the name servers) is keyed by its broker name, every other broker by
        ``name@address``.

        Role, epoch, configured broker id and the in-sync set come from the broker itself
        (its ``replication`` section), so a demoted first master reads as the slave it is,
        under the id it was started with; the in-sync set is named like the brokers (an id
        no listed broker has is shown as ``name id N``).  A broker without that section (a
        single broker) is described by the name servers' listing."""
        out: dict[str, dict] = {}
        failures: list[BaseException] = []
        for name, broker_id, addr in self.members():
            label = broker_label(name, addr)
            key = name if broker_id == MASTER_ID else label
            head = {"address": addr, "brokerName": name, "label": label, "brokerId": broker_id,
                    "role": "master" if broker_id == MASTER_ID else "slave"}
            try:
                doc = self._json(await self._call(addr, RequestCode.BROKER_STATUS, "status"), "status")
            except (OSError, ConnectionError) as exc:  # one broker down: show the others
                failures.append(exc)
                out[key] = {**head, "error": f"unreachable: {exc or type(exc).__name__}"}
                continue
            doc = doc if isinstance(doc, dict) else {}
            replication = doc.get("replication")
            if isinstance(replication, dict):
                head.update({k: replication[k] for k in ("role", "epoch", "brokerId")
                             if k in replication})
            out[key] = {**head, **doc}
        if failures and len(failures) == len(out):
            raise failures[0]
        for doc in out.values():
            doc["inSyncReplicas"] = _in_sync_names(doc, out.values())
        live = {doc["address"] for doc in out.values()}
        for down in await self.brokers_down():
            if down["address"] not in live:
                label = broker_label(down["brokerName"], down["address"])
                out[label] = {"address": down["address"], "brokerName": down["brokerName"],
                              "label": label, "brokerId": down["brokerId"], "role": "down",
                              "downSince": down["since"], "downReason": down["why"]}
        return out

    async def brokers_down(self) -> list[dict]:
        """Brokers the name server dropped and has not seen since (``address``,
        ``brokerName``, ``brokerId``, ``since`` in epoch ms, ``why``), oldest first; empty
        from a broker's embedded name server, which knows no other broker, and from any name
        server that refuses the request (the list only adds to what ``status`` shows)."""
        resp = await self._instance.namesrv.invoke(RemotingCommand.request(RequestCode.BROKERS_DOWN))
        if resp.code != ResponseCode.SUCCESS:
            return []
        rows = self._json(resp, "list brokers down")
        if not isinstance(rows, list):
            return []
        keys = {"address": str, "brokerName": str, "brokerId": int, "since": int, "why": str}
        return [row for row in rows if isinstance(row, dict)
                and all(isinstance(row.get(k), t) for k, t in keys.items())]

    # --- transactions --------------------------------------------------------------------
    def _group_readers(self) -> dict[str, str]:
        """Broker name -> the address holding its halves: the master, else the lowest slave."""
        namesrv = self._instance.namesrv
        return {name: namesrv.read_addr(name) for name in sorted(namesrv.groups)}

    async def txn_list(self, state: str = "pending") -> list[dict]:
        """Half messages of every broker group (``pending``, ``discarded`` or ``all``),
        oldest first per group, each row with ``broker`` (name) and ``address`` added."""
        if state not in TXN_LIST_STATES:
            raise ValueError("state must be pending, discarded or all")
        rows: list[dict] = []
        for name, addr in self._group_readers().items():
            doc = self._json(await self._call(addr, RequestCode.TXN_LIST, "list transactions",
                                              TxnListRequestHeader(state=state)), "list transactions")
            for row in _rows(doc):
                rows.append({"broker": name, "address": addr, **row})
        return rows

    async def txn_show(self, txn_id: str) -> dict:
        """One transaction by id (UNIQ_KEY) or offsetMsgId: pending, discarded, or decided
        (then with ``source``, ``operator``, ``decided_at`` from the broker's history).

        Raises :class:`TransactionNotFoundError` if no broker knows the id."""
        if not txn_id or not isinstance(txn_id, str):
            raise ValueError("a transaction id is required")
        return await self._txn_request(RequestCode.TXN_SHOW, TxnShowRequestHeader(id=txn_id), txn_id,
                                       f"show transaction {txn_id}")

    async def txn_decide(self, txn_id: str, decision: str, operator: str) -> dict:
        """Operator decision on a half: commit, rollback, or resume (check it again).

        The answer's ``outcome`` is ``apply`` or ``duplicate`` (it was already so: nothing
        written).  A contradicting decision raises :class:`BrokerError` with code
        TRANSACTION_FAILED and a remark such as ``transaction <id> is already committed;
        rollback refused``; an unknown id raises :class:`TransactionNotFoundError`, and a
        Kafka transactional id its subclass :class:`KafkaTransactionalIdError` (a Kafka
        transaction is decided by its producer; an operator can only abort it,
        :meth:`kafka_txn_abort`)."""
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {', '.join(DECISIONS)}")
        if not operator:
            raise ValueError("an operator name is required")
        if not txn_id or not isinstance(txn_id, str):
            raise ValueError("a transaction id is required")
        try:
            return await self._txn_request(RequestCode.TXN_DECIDE, TxnDecideRequestHeader(
                id=txn_id, decision=decision, operator=operator), txn_id,
                f"{decision} transaction {txn_id}")
        except TransactionNotFoundError as missing:
            # TXN_DECIDE knows half messages only; TXN_SHOW also answers Kafka ids, so an
            # operator who typed a transactional id learns what applies to it instead
            try:
                doc = await self.txn_show(txn_id)
            except TransactionNotFoundError:
                raise missing from None
            if doc.get("kind") != "kafka":
                raise
            addr = self.brokers.get(str(doc.get("broker")), ", ".join(missing.addrs))
            raise KafkaTransactionalIdError(txn_id, addr) from None

    async def kafka_txn_list(self, *, open_only: bool = False, hanging: bool = False) -> list[dict]:
        """Kafka transactions of every master (each row with ``broker`` and ``address``):
        every transactional id its coordinator knows, only the open ones (``open_only``), or
        only those open past their timeout (``hanging``, like kafka-transactions.sh
        find-hanging).  A broker without the Kafka listener, or one older than these
        requests, has none."""
        rows: list[dict] = []
        header = KafkaTxnListRequestHeader(open_only=open_only, hanging=hanging)
        for name, addr in self.brokers.items():
            resp = await self._instance.invoke(addr, RemotingCommand.request(
                RequestCode.KAFKA_TXN_LIST, header.to_ext()))
            if resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
                continue
            if resp.code != ResponseCode.SUCCESS:
                raise BrokerError("list Kafka transactions", resp.code, resp.remark, addr)
            for row in _rows(self._json(resp, "list Kafka transactions")):
                rows.append({"broker": name, "address": addr, **row})
        return rows

    async def kafka_txn_abort(self, transactional_id: str, operator: str) -> dict:
        """Abort the open Kafka transaction of ``transactional_id`` as ``operator``: its
        records never become visible and its producer is fenced (the epoch is bumped).  The
        answer's ``outcome`` is ``aborted``, or ``not-open`` when it had nothing open (nothing
        changed); an id no broker knows raises :class:`TransactionNotFoundError`."""
        if not transactional_id or not isinstance(transactional_id, str):
            raise ValueError("a transactional id is required")
        if not operator:
            raise ValueError("an operator name is required")
        return await self._txn_request(
            RequestCode.KAFKA_TXN_ABORT,
            KafkaTxnAbortRequestHeader(transactional_id=transactional_id, operator=operator),
            transactional_id, f"abort Kafka transaction {transactional_id}")

    async def _txn_request(self, code: int, header: Header, txn_id: str, what: str) -> dict:
        """Ask the brokers in turn; the first that knows ``txn_id`` answers."""
        missing: list[str] = []
        errors: list[BrokerError] = []
        for name, addr in self.brokers.items():
            resp = await self._instance.invoke(addr, RemotingCommand.request(code, header.to_ext()))
            if resp.code == ResponseCode.SUCCESS:
                doc = self._json(resp, what)
                return {"broker": name, **(doc if isinstance(doc, dict) else {"value": doc})}
            if resp.code in (ResponseCode.QUERY_NOT_FOUND, ResponseCode.REQUEST_CODE_NOT_SUPPORTED):
                missing.append(addr)
            else:
                errors.append(BrokerError(what, resp.code, resp.remark, addr))
        if not errors:
            raise TransactionNotFoundError(txn_id, missing)
        raise errors[0] if len(errors) == 1 else ClientError("; ".join(map(str, errors)))


class TransactionNotFoundError(LocatedError):
    """No broker knows the transaction id: never prepared there, or decided so long ago that
    its decision history forgot it (``transaction_history_size``)."""

    def __init__(self, txn_id: str, addrs: list[str], reason: str | None = None) -> None:
        super().__init__(reason or f"no transaction {txn_id}", ", ".join(addrs))
        self.txn_id = txn_id
        self.addrs = addrs


class KafkaTransactionalIdError(TransactionNotFoundError):
    """A half-message decision named a Kafka transactional id: no half message has it, and a
    Kafka transaction is committed or aborted by its producer; an operator can only abort it
    (KAFKA_TXN_ABORT, which also fences the producer)."""

    def __init__(self, txn_id: str, addr: str) -> None:
        super().__init__(txn_id, [addr], f"{txn_id} is a Kafka transactional id, not a half "
                         "message: an operator can only abort a Kafka transaction")


def _in_sync_names(doc: dict, docs: Iterable[dict]) -> list[str]:
    """The in-sync set ``doc``'s broker reports (configured ids), named as brokers are:
    each id by the broker of the same group started with it."""
    replication = doc.get("replication")
    ids = replication.get("inSyncReplicas") if isinstance(replication, dict) else None
    if not isinstance(ids, list):
        return []
    name = doc["brokerName"]
    by_id = {d["brokerId"]: d["label"] for d in docs
             if d["brokerName"] == name and isinstance(d.get("replication"), dict)}
    return [by_id.get(i, f"{name} id {i}") for i in ids]


def _check_queues(queues: object) -> None:
    if not isinstance(queues, int) or isinstance(queues, bool) or not 1 <= queues <= 1024:
        raise ValueError("queues must be an integer in [1, 1024]")


def _queue_count(cfg: dict) -> int:
    return max(int(cfg.get("readQueueNums", 0)), int(cfg.get("writeQueueNums", 0)))


def _config_table(doc: object) -> dict:
    """The ``topicConfigTable`` of a GET_ALL_TOPIC_CONFIG answer ({} if absent)."""
    table = doc.get("topicConfigTable") if isinstance(doc, dict) else None
    return table if isinstance(table, dict) else {}


def _rows(doc: object) -> list[dict]:
    """The rows of a TXN_LIST answer (a JSON array of objects)."""
    if not isinstance(doc, list):
        raise ClientError("list transactions: answer is not a JSON array")
    return [r for r in doc if isinstance(r, dict)]

"""Order service on txbroker: an order is recorded and announced atomically.

The local transaction is a real SQLite transaction that writes two rows — the order and a
transaction-log row keyed by the message's transaction id — and commits both or neither.
``check_local_transaction`` answers the broker's check-back from that log, so *any* process of
the producer group can answer for a producer that died between its database commit and its
END_TRANSACTION: a logged transaction committed, a missing one older than a few seconds never
will.  The consumer applies orders to its own database idempotently (at-least-once delivery
means a message can arrive twice).

The two SQLite databases, ``orders.db`` and ``shipments.db``, live in ``--data-dir``
(default ``.example-data/`` in the current directory, created when missing).

Run against ``txbroker serve`` (see the README)::

    python examples/orders/orders.py place --item book --quantity 2
    python examples/orders/orders.py place --item lamp --quantity 1 --fail        # rolled back
    python examples/orders/orders.py place --item desk --quantity 1 --lose-end    # checked back
    python examples/orders/orders.py checker --seconds 10                         # answers checks
    python examples/orders/orders.py apply --max 2 --timeout 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sqlite3
import sys
import time
import uuid
from pathlib import Path

from txbroker.client import (
    Consumer,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionListener,
    TransactionProducer,
)
from txbroker.client.errors import ClientError

TOPIC = "Orders"
PRODUCER_GROUP = "order-service"
CONSUMER_GROUP = "order-applier"
#: A transaction with no log row this long after its half was sent never committed locally.
UNDECIDED_GRACE_SECONDS = 5.0
#: Where the databases go unless --data-dir says otherwise (git-ignored in the repository).
DEFAULT_DATA_DIR = ".example-data"
ORDERS_DB = "orders.db"
SHIPMENTS_DB = "shipments.db"

log = logging.getLogger("orders")


def open_orders_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=10)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS orders (order_id TEXT PRIMARY KEY, item TEXT NOT NULL, "
               "quantity INTEGER NOT NULL CHECK (quantity > 0), created_at REAL NOT NULL)")
    db.execute("CREATE TABLE IF NOT EXISTS tx_log (transaction_id TEXT PRIMARY KEY, "
               "order_id TEXT NOT NULL, created_at REAL NOT NULL)")
    return db


class OrderTransactions(TransactionListener):
    """The local transaction of an order, and the check-back answered from the same database."""

    def __init__(self, db_path: str, *, fail: bool = False, lose_end: bool = False) -> None:
        self.db_path = db_path
        self.fail = fail
        self.lose_end = lose_end

    def _record(self, tx_id: str, order: dict) -> None:
        db = open_orders_db(self.db_path)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("INSERT INTO orders VALUES (?, ?, ?, ?)",
                           (order["order_id"], order["item"], order["quantity"], time.time()))
                if self.fail:
                    raise sqlite3.IntegrityError("simulated failure after the order row")
                db.execute("INSERT INTO tx_log VALUES (?, ?, ?)", (tx_id, order["order_id"], time.time()))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        finally:
            db.close()

    async def execute_local_transaction(self, msg: MessageExt, order: dict) -> LocalTransactionState:
        try:
            await asyncio.to_thread(self._record, msg.transaction_id, order)
        except sqlite3.Error as exc:
            log.warning("order %s not recorded (%s): rolling back", order["order_id"], exc)
            return LocalTransactionState.ROLLBACK_MESSAGE
        if self.lose_end:
            # As if this process died right after its database commit.
            return LocalTransactionState.UNKNOW
        return LocalTransactionState.COMMIT_MESSAGE

    def _lookup(self, tx_id: str) -> bool:
        db = open_orders_db(self.db_path)
        try:
            return db.execute("SELECT 1 FROM tx_log WHERE transaction_id = ?", (tx_id,)).fetchone() is not None
        finally:
            db.close()

    async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        if await asyncio.to_thread(self._lookup, msg.transaction_id):
            state = LocalTransactionState.COMMIT_MESSAGE
        elif time.time() - msg.born_timestamp / 1000.0 > UNDECIDED_GRACE_SECONDS:
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            state = LocalTransactionState.UNKNOW  # the local transaction may still be running
        log.info("check-back for %s (keys %s): %s", msg.transaction_id, msg.keys, state.name)
        print(json.dumps({"check": msg.transaction_id, "order_id": msg.keys, "state": state.name}),
              flush=True)
        return state


async def place(args: argparse.Namespace) -> int:
    order = {"order_id": args.order_id or uuid.uuid4().hex[:12], "item": args.item,
             "quantity": args.quantity}
    listener = OrderTransactions(str(args.data_dir / ORDERS_DB), fail=args.fail, lose_end=args.lose_end)
    async with TransactionProducer(PRODUCER_GROUP, args.namesrv, listener=listener) as producer:
        msg = Message(TOPIC, json.dumps(order).encode(), tags="created", keys=order["order_id"])
        result = await producer.send_message_in_transaction(msg, order)
    print(json.dumps({"order_id": order["order_id"], "transaction_id": result.transaction_id,
                      "state": result.local_transaction_state.name}), flush=True)
    return 0


async def checker(args: argparse.Namespace) -> int:
    """Stay in the producer group for a while, answering check-backs from the database."""
    listener = OrderTransactions(str(args.data_dir / ORDERS_DB))
    async with TransactionProducer(PRODUCER_GROUP, args.namesrv, listener=listener,
                                   heartbeat_interval=min(30.0, args.seconds)):
        print(json.dumps({"checker": "ready"}), flush=True)
        await asyncio.sleep(args.seconds)
    return 0


def open_applied_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, timeout=10)
    db.execute("CREATE TABLE IF NOT EXISTS shipments (order_id TEXT PRIMARY KEY, item TEXT NOT NULL, "
               "quantity INTEGER NOT NULL, applied_at REAL NOT NULL)")
    return db


async def apply(args: argparse.Namespace) -> int:
    """Apply orders to the shipping database; a redelivered order is applied once."""
    db = open_applied_db(str(args.data_dir / SHIPMENTS_DB))
    consumer = Consumer(CONSUMER_GROUP, args.namesrv, from_where="first",
                        long_poll_timeout=min(15.0, args.timeout))
    consumer.subscribe(TOPIC, "created")
    applied = 0
    async with consumer:
        while args.max is None or applied < args.max:
            msg = await consumer.poll(args.timeout)
            if msg is None:
                break
            order = json.loads(msg.body)
            cur = db.execute("INSERT OR IGNORE INTO shipments VALUES (?, ?, ?, ?)",
                             (order["order_id"], order["item"], order["quantity"], time.time()))
            print(json.dumps({"applied": order["order_id"], "new": cur.rowcount == 1}), flush=True)
            applied += 1
    db.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default=os.environ.get("TXBROKER_NAMESRV", "127.0.0.1:9876"))
    parser.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR),
                        help=f"directory of {ORDERS_DB} and {SHIPMENTS_DB} (default: {DEFAULT_DATA_DIR}, "
                             "created when missing)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("place", help="place an order (database row + message, atomically)")
    p.add_argument("--item", required=True)
    p.add_argument("--quantity", type=int, default=1)
    p.add_argument("--order-id")
    p.add_argument("--fail", action="store_true", help="fail the local transaction")
    p.add_argument("--lose-end", action="store_true",
                   help="commit locally but never tell the broker (it checks back)")
    c = sub.add_parser("checker", help="answer check-backs for the producer group")
    c.add_argument("--seconds", type=float, default=30.0)
    a = sub.add_parser("apply", help="consume orders into the shipping database")
    a.add_argument("--max", type=int)
    a.add_argument("--timeout", type=float, default=30.0, help="stop after this many idle seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    handler = {"place": place, "checker": checker, "apply": apply}[args.command]
    try:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(handler(args))
    except (ClientError, OSError, ValueError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)  # one line, no traceback
        return 1


if __name__ == "__main__":
    sys.exit(main())

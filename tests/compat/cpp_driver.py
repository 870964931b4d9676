"""Drive the unmodified RocketMQ C++ client (PyPI ``rocketmq==0.4.4``) for one scenario.

Run only as a subprocess (``python cpp_driver.py '<json spec>'``): the ctypes library can
crash or hang, so the caller bounds every run with a timeout and kills it if needed.  Output
is one JSON object per line on stdout, so the caller can assert on exactly what the real
client saw: ``{"event": "sent", ...}`` per send result, ``{"event": "msg", ...}`` per
consumed message, ``{"event": "error", ...}`` when the client raised (producer events carry
``t``, the wall-clock time the call returned, comparable with the caller's), and
``{"event": "done"}`` after a clean shutdown.

Spec keys: ``scenario`` (send_sync, send_oneway, send_batch, send_orderly, send_large,
send_tx_props, push_consume, pull_consume), ``namesrv``, ``topic``, ``group``, and per
scenario: ``count``, ``body``, ``keys``, ``tags``, ``props``, ``arg`` (send_orderly),
``size`` (send_large), ``batch_size`` (send_batch), ``send_timeout_ms``, ``interval`` (seconds
between producer sends, so a run spans a failover), ``expression``, ``expect`` (messages to wait for), ``max_seconds``,
``linger`` (seconds to stay up after ``expect`` was reached, so offsets get committed),
``record_props`` (property names to report per consumed message), ``stop_file`` (push_consume
and the producers stop as soon as this file exists), ``orderly`` (push_consume: orderly listener, which locks
its queues with LOCK_BATCH_MQ), ``access_key``/``secret_key`` (producers: session credentials,
so every request is signed).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from rocketmq.client import Message, Producer, PullConsumer, PushConsumer


class _Events:
    """Events go to the original stdout, kept for them alone.

    The native library prints to fd 1 through C stdio on its own schedule; sharing the stream
    could splice its text into an event line.  ``claim_stdout`` moves fd 1 to stderr for the
    library and keeps a private duplicate of the real stdout here.
    """

    stream = sys.stdout


def claim_stdout() -> None:
    private = os.dup(1)
    os.dup2(2, 1)
    _Events.stream = os.fdopen(private, "w", buffering=1)


def emit(**fields: object) -> None:
    _Events.stream.write(json.dumps(fields, sort_keys=True) + "\n")
    _Events.stream.flush()


def text(value: object) -> str:
    """The C API hands back bytes for tags/keys/body/properties; JSON needs text."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def make_message(spec: dict, body: str, keys: str | None = None) -> Message:
    m = Message(spec["topic"])
    if keys or spec.get("keys"):
        m.set_keys(keys or spec["keys"])
    if spec.get("tags"):
        m.set_tags(spec["tags"])
    for k, v in spec.get("props", {}).items():
        m.set_property(k, v)
    m.set_body(body)
    return m


def record(m, props: list[str]) -> dict:
    return {
        "event": "msg", "id": text(m.id), "topic": text(m.topic), "tags": text(m.tags),
        "keys": text(m.keys), "body": text(m.body), "queue_id": m.queue_id,
        "queue_offset": m.queue_offset, "commit_log_offset": m.commit_log_offset,
        "reconsume_times": m.reconsume_times,
        "props": {p: text(m.get_property(p)) for p in props},
    }


def sent(kind: str, result) -> None:
    emit(event="sent", kind=kind, status=int(result.status), msg_id=result.msg_id,
         offset=result.offset, t=time.time())


def run_producer(spec: dict) -> None:
    p = Producer(spec["group"], timeout=spec.get("send_timeout_ms", 3000))
    p.set_namesrv_addr(spec["namesrv"])
    if "access_key" in spec:
        p.set_session_credentials(spec["access_key"], spec["secret_key"], "ALIYUN")
    p.start()
    try:
        s = spec["scenario"]
        count = spec.get("count", 1)
        body = spec.get("body", "compat body")
        stop_file = spec.get("stop_file")
        for i in range(count):
            if stop_file and os.path.exists(stop_file):
                break
            b = f"{body} {i}" if count > 1 else body
            try:
                if s in ("send_sync", "send_tx_props"):
                    sent(s, p.send_sync(make_message(spec, b)))
                elif s == "send_large":
                    sent(s, p.send_sync(make_message(spec, (b + ":") + "x" * spec.get("size", 5000))))
                elif s == "send_oneway":
                    p.send_oneway(make_message(spec, b))
                    emit(event="sent", kind=s)
                elif s == "send_orderly":
                    sent(s, p.send_orderly(make_message(spec, b), spec.get("arg", 7)))
                elif s == "send_batch":
                    msgs = [make_message(spec, f"{b} part {j}", keys=f"BK{i}-{j}")
                            for j in range(spec.get("batch_size", 3))]
                    sent(s, p.send_batch(msgs))
                else:
                    raise SystemExit(f"unknown producer scenario {s}")
            except Exception as e:  # noqa: BLE001 - the caller asserts on what the client raised
                emit(event="error", kind=s, error=f"{type(e).__name__}: {e}", t=time.time())
            time.sleep(spec.get("interval", 0.0))
        # A one-way send returns before the frame is written; give it time to leave.
        time.sleep(spec.get("linger", 0.5))
    finally:
        p.shutdown()


def run_push(spec: dict) -> None:
    lock = threading.Lock()
    seen = {"n": 0}
    props = spec.get("record_props", [])
    reached = threading.Event()

    def on_message(m) -> None:
        with lock:
            seen["n"] += 1
            emit(**record(m, props))
            if seen["n"] >= spec.get("expect", 1 << 30):
                reached.set()

    c = PushConsumer(spec["group"], orderly=spec.get("orderly", False))
    c.set_namesrv_addr(spec["namesrv"])
    c.set_thread_count(1)
    c.subscribe(spec["topic"], on_message, spec.get("expression", "*"))
    c.start()
    emit(event="started")
    deadline = time.monotonic() + spec.get("max_seconds", 15)
    stop_file = spec.get("stop_file")
    while time.monotonic() < deadline and not reached.wait(0.1):
        if stop_file and os.path.exists(stop_file):
            break
    time.sleep(spec.get("linger", 0.0))
    c.shutdown()


class BrokerAwarePullConsumer(PullConsumer):
    """The wheel's Python ``PullConsumer.pull`` keeps its next offsets keyed by topic and
    queue id only, so with two broker groups queue 0 of the second group starts where queue 0
    of the first ended and skips messages.  Keying by broker name too fixes that Python-side
    bookkeeping; the native client's calls (fetch queues, pull) are unchanged."""

    def __init__(self, group: str) -> None:
        super().__init__(group)
        self.offset_table = {}  # the wheel's table is a class attribute, shared by instances

    def _get_mq_key(self, mq) -> str:
        return f"{text(mq.topic)}@{text(mq.brokerName)}@{mq.queueId}"


def run_pull(spec: dict) -> None:
    c = BrokerAwarePullConsumer(spec["group"])
    c.set_namesrv_addr(spec["namesrv"])
    c.start()
    try:
        props = spec.get("record_props", [])
        for m in c.pull(spec["topic"], spec.get("expression", "*")):
            emit(**record(m, props))
    finally:
        c.shutdown()


def main() -> None:
    claim_stdout()
    spec = json.loads(sys.argv[1])
    if spec["scenario"] == "push_consume":
        run_push(spec)
    elif spec["scenario"] == "pull_consume":
        run_pull(spec)
    else:
        run_producer(spec)
    emit(event="done")


if __name__ == "__main__":
    main()

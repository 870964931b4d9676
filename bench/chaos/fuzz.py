"""A network fuzzer for a running broker: garbage bytes, broken framing, invalid requests.

Every case opens its own connection, writes its bytes and watches what comes back:

* framing the decoder cannot accept (random bytes, lying lengths, unknown serialize types,
  truncated frames followed by EOF) must make the broker close that connection;
* a well-formed frame carrying an invalid request (wrong types, negative or huge offsets,
  unknown or system topics, non-UTF-8 text, oversize bodies, unknown codes) must get an answer
  whose code is not SUCCESS — never silence, never a success;
* the broker must keep serving: the caller runs a healthy client throughout and checks it.

Every run starts with the same sweep (a send to every bad and system topic, a pull of every
system topic); then ``rounds`` cases are drawn from a seeded ``random.Random``, each drawing its
own values when it is made, so a failing run is reproduced by its seed.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from txbroker.remoting.codec import FrameDecoder, encode
from txbroker.remoting.codes import RequestCode, ResponseCode
from txbroker.remoting.command import ProtocolError, RemotingCommand

SYSTEM_TOPICS = ("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                 "TRANS_CHECK_MAX_TIME_TOPIC", "SCHEDULE_TOPIC_XXXX")
#: Topics no send may store: malformed names, a reserved prefix, retry topics of no group.
BAD_TOPICS = ("", "bad topic", "a/b", "x" * 300, "topic\u00e9", "%RETRY%", "%RETRY%fuzz_no_such_group",
              "RMQ_SYS_X")
HUGE = str(1 << 62)
TOO_HUGE = str(1 << 70)

# expectations
CLOSE, ANSWER_ERROR, ANY = "close", "error", "any"


@dataclass
class Case:
    name: str
    data: bytes
    expect: str
    #: The request's topic, if any (the stats count cases per topic).
    topic: str | None = None
    eof: bool = False


@dataclass
class FuzzStats:
    cases: Counter = field(default_factory=Counter)
    #: (case name, topic) -> count, for the cases that name a topic.
    topics: Counter = field(default_factory=Counter)
    codes: Counter = field(default_factory=Counter)
    closed: int = 0
    #: Requests that needed an answer and got none while the connection stayed open.
    silent: list[str] = field(default_factory=list)
    #: Invalid requests answered SUCCESS.
    accepted: list[str] = field(default_factory=list)
    #: Bad framing the broker did not close on.
    left_open: list[str] = field(default_factory=list)
    #: Error answers without a remark saying what was wrong (reported, not a failure).
    unexplained: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not (self.silent or self.accepted or self.left_open)


def frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    """A frame with exactly the header bytes given (which need not be valid JSON)."""
    mark = (serialize_type << 24) | len(header)
    return struct.pack(">iI", 4 + len(header) + len(body), mark) + header + body


def json_request(code: object, ext: object, body: bytes = b"", opaque: int = 1, **extra: object) -> bytes:
    doc = {"code": code, "language": "JAVA", "version": 409, "opaque": opaque, "flag": 0,
           "extFields": ext, **extra}
    return frame(orjson.dumps(doc), body)


def request(code: int, ext: dict[str, str], body: bytes = b"") -> bytes:
    return encode(RemotingCommand.request(code, ext, body, opaque=1))


def send_ext(topic: str, **over: str) -> dict[str, str]:
    ext = {"producerGroup": "fuzz_pg", "topic": topic, "defaultTopic": "TBW102",
           "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
           "bornTimestamp": "1700000000000", "flag": "0", "properties": "", "reconsumeTimes": "0"}
    ext.update(over)
    return ext


def pull_ext(topic: str, **over: str) -> dict[str, str]:
    ext = {"consumerGroup": "fuzz_cg", "topic": topic, "queueId": "0", "queueOffset": "0",
           "maxMsgNums": "8", "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0",
           "subscription": "*", "subVersion": "0"}
    ext.update(over)
    return ext


def _framing_cases(rng: random.Random, max_message_size: int) -> list[Callable[[], Case]]:
    good = request(RequestCode.SEND_MESSAGE, send_ext("FuzzTopic"), b"x")
    return [
        lambda: Case("random-bytes", rng.randbytes(rng.randint(1, 300)), ANY, eof=True),
        lambda: Case("truncated-frame", good[:rng.randint(1, len(good) - 1)], CLOSE, eof=True),
        lambda: Case("lying-length-huge", struct.pack(">ii", 0x7FFFFFF0, 20) + b"{" * 20, CLOSE),
        lambda: Case("lying-length-negative", struct.pack(">ii", -rng.randint(1, 1 << 30), 0), CLOSE),
        lambda: Case("lying-length-short", struct.pack(">ii", rng.randint(0, 3), 0) + b"{}", CLOSE),
        lambda: Case("header-longer-than-frame", struct.pack(">ii", 12, 500) + b"{}" * 4, CLOSE),
        lambda: Case("unknown-serialize-type", frame(b"{}", serialize_type=rng.randint(2, 255)), CLOSE),
        lambda: Case("frame-over-limit", struct.pack(">ii", max_message_size * 100, 2) + b"{}", CLOSE),
        lambda: Case("header-not-json", frame(rng.choice([b"{", b"not json", b"[1,2]", b"\x00\x01",
                                                          b'{"code":'])), ANY, eof=True),
        lambda: Case("header-non-utf8", frame(b'{"code":10,"opaque":1,"extFields":{"topic":"\xff\xfe"}}'),
                     ANY, eof=True),
        lambda: Case("header-wrong-types", json_request(rng.choice(["ten", None, [10], 1.5]),
                                                        {"topic": "T"}), ANY, eof=True),
        lambda: Case("ext-not-object", json_request(RequestCode.SEND_MESSAGE, ["topic", "T"]), ANY, eof=True),
    ]


def send_case(name: str, ext: dict[str, str], body: bytes = b"fuzz") -> Case:
    return Case(name, request(RequestCode.SEND_MESSAGE, ext, body), ANSWER_ERROR, ext.get("topic"))


def pull_case(name: str, ext: dict[str, str]) -> Case:
    return Case(name, request(RequestCode.PULL_MESSAGE, ext), ANSWER_ERROR, ext.get("topic"))


def coverage_cases() -> list[Case]:
    """Run first, whatever the seed and round count: a send to every bad and every system
    topic and a pull of every system topic, so no run leaves one of them out."""
    return ([send_case("send-bad-topic", send_ext(t)) for t in BAD_TOPICS]
            + [send_case("send-system-topic", send_ext(t)) for t in SYSTEM_TOPICS]
            + [pull_case("pull-system-topic", pull_ext(t)) for t in SYSTEM_TOPICS])


def _cycle(values: tuple[str, ...], rng: random.Random) -> Callable[[], str]:
    """Each call returns the next value of a shuffled cycle: every value is drawn once per
    ``len(values)`` calls, so a run covers them all (and stays reproducible by its seed)."""
    order = list(values)
    rng.shuffle(order)
    it = itertools.cycle(order)
    return lambda: next(it)


def _request_cases(rng: random.Random, max_message_size: int) -> list[Callable[[], Case]]:
    # Every maker draws its values when it is called, once per case, never once per run.
    def send(name: str, make_ext: Callable[[], dict[str, str]], body: bytes = b"fuzz") -> Callable[[], Case]:
        return lambda: send_case(name, make_ext(), body)

    def pull(name: str, make_ext: Callable[[], dict[str, str]]) -> Callable[[], Case]:
        return lambda: pull_case(name, make_ext())

    bad_topic = _cycle(BAD_TOPICS, rng)
    send_system, pull_system = _cycle(SYSTEM_TOPICS, rng), _cycle(SYSTEM_TOPICS, rng)
    cases = [
        send("send-system-topic", lambda: send_ext(send_system())),
        send("send-bad-topic", lambda: send_ext(bad_topic())),
        # A negative queue id means "any queue" in RocketMQ; only ids past the queues are invalid.
        send("send-queue-out-of-range",
             lambda: send_ext("FuzzTopic", queueId=str(rng.randint(4, (1 << 31) - 1)))),
        send("send-queue-not-int",
             lambda: send_ext("FuzzTopic", queueId=rng.choice(["abc", "1.5", "", HUGE]))),
        send("send-sysflag-negative", lambda: send_ext("FuzzTopic", sysFlag="-7")),
        send("send-born-not-int",
             lambda: send_ext("FuzzTopic", bornTimestamp=rng.choice(["yesterday", TOO_HUGE]))),
        send("send-missing-topic",
             lambda: {k: v for k, v in send_ext("FuzzTopic").items() if k != "topic"}),
        send("send-oversize-body", lambda: send_ext("FuzzTopic"), b"o" * (max_message_size + 1)),
        send("send-empty-body", lambda: send_ext("FuzzTopic"), b""),
        send("send-missing-group", lambda: send_ext("FuzzTopic", producerGroup="")),
        pull("pull-negative-offset",
             lambda: pull_ext("FuzzTopic", queueOffset=str(-rng.randint(1, 1 << 40)))),
        pull("pull-offset-not-int",
             lambda: pull_ext("FuzzTopic", queueOffset=rng.choice(["x", TOO_HUGE, "1e3"]))),
        pull("pull-unknown-topic", lambda: pull_ext(f"NoSuchTopic{rng.randint(0, 1 << 30)}")),
        pull("pull-system-topic", lambda: pull_ext(pull_system())),
        pull("pull-bad-queue", lambda: pull_ext("FuzzTopic", queueId=rng.choice(["-1", "9999", "q"]))),
        pull("pull-zero-max", lambda: pull_ext("FuzzTopic", maxMsgNums=rng.choice(["0", "-3"]))),
        lambda: Case("update-offset-negative", request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "fuzz_cg", "topic": "FuzzTopic", "queueId": "0",
            "commitOffset": rng.choice(["-5", "abc", TOO_HUGE])}), ANSWER_ERROR),
        lambda: Case("query-offset-bad", request(RequestCode.QUERY_CONSUMER_OFFSET, {
            "consumerGroup": rng.choice(["", "fuzz_cg"]), "topic": "", "queueId": "0"}), ANSWER_ERROR),
        lambda: Case("create-system-topic", request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
            "topic": rng.choice(SYSTEM_TOPICS), "defaultTopic": "TBW102", "readQueueNums": "4",
            "writeQueueNums": "4", "perm": "6", "topicFilterType": "SINGLE_TAG"}), ANSWER_ERROR),
        lambda: Case("delete-system-topic", request(215, {"topic": rng.choice(SYSTEM_TOPICS)}), ANSWER_ERROR),
        lambda: Case("unknown-code", request(rng.choice([9999, 31999, -1, 0]), {}), ANSWER_ERROR),
        lambda: Case("end-tx-not-a-half", request(RequestCode.END_TRANSACTION, {
            "producerGroup": "fuzz_pg", "tranStateTableOffset": rng.choice(["0", "-1", HUGE]),
            "commitLogOffset": rng.choice(["0", "-1", HUGE, "x"]), "commitOrRollback": "8",
            "fromTransactionCheck": "false", "msgId": "X", "transactionId": "X"}), ANSWER_ERROR),
    ]
    return cases


def cases(rng: random.Random, max_message_size: int) -> list[Callable[[], Case]]:
    return _framing_cases(rng, max_message_size) + _request_cases(rng, max_message_size)


async def run_case(host: str, port: int, case: Case, timeout: float) -> tuple[list[RemotingCommand], bool]:
    """Send one case; returns (answers, closed-by-broker)."""
    reader, writer = await asyncio.open_connection(host, port)
    decoder = FrameDecoder(64 * 1024 * 1024)
    answers: list[RemotingCommand] = []
    closed = False
    try:
        writer.write(case.data)
        await writer.drain()
        if case.eof and writer.can_write_eof():
            writer.write_eof()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not answers and (remaining := deadline - loop.time()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), remaining)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            try:
                answers += decoder.feed(chunk)
            except ProtocolError:
                answers.append(RemotingCommand(code=-1, remark="undecodable answer"))
    except (ConnectionError, OSError):
        closed = True
    finally:
        writer.close()
    return answers, closed


async def fuzz_broker(addr: str, *, seed: int, rounds: int, max_message_size: int,
                      timeout: float = 3.0, concurrency: int = 4) -> FuzzStats:
    host, port = addr.rsplit(":", 1)
    rng = random.Random(seed)
    makers = cases(rng, max_message_size)
    stats = FuzzStats()
    slots = asyncio.Semaphore(concurrency)

    async def one(case: Case) -> None:
        async with slots:
            answers, closed = await run_case(host, int(port), case, timeout)
        stats.cases[case.name] += 1
        if case.topic is not None:
            stats.topics[(case.name, case.topic)] += 1
        stats.closed += closed
        for a in answers:
            stats.codes[a.code] += 1
        if case.expect == ANSWER_ERROR:
            if not answers and not closed:
                stats.silent.append(case.name)
            elif any(a.code == ResponseCode.SUCCESS for a in answers):
                stats.accepted.append(case.name)
            for a in answers:
                if not a.remark:
                    stats.unexplained[(case.name, a.code)] += 1
        elif case.expect == CLOSE and not closed and not answers:
            stats.left_open.append(case.name)
        elif case.expect == ANY and any(a.code == ResponseCode.SUCCESS for a in answers):
            stats.accepted.append(case.name)

    await asyncio.gather(*(one(case) for case in coverage_cases()))
    await asyncio.gather(*(one(rng.choice(makers)()) for _ in range(rounds)))
    return stats


async def _main(rounds: int, seed: int) -> int:
    import tempfile
    from pathlib import Path

    from txbroker.bench.chaos.driver import broker_settings
    from txbroker.bench.chaos.process import BrokerProcess

    with tempfile.TemporaryDirectory(prefix="txbroker-fuzz-") as tmp:
        proc = BrokerProcess(Path(tmp) / "data", broker_settings("async"), Path(tmp) / "broker.log")
        await asyncio.to_thread(proc.start)
        try:
            stats = await fuzz_broker(proc.broker_addr, seed=seed, rounds=rounds, max_message_size=256 * 1024)
            alive = proc.alive()
            proc.kill()
            restart = await asyncio.to_thread(proc.start)  # the store is still valid
        finally:
            proc.kill()
    print(f"network fuzz: seed={seed} rounds={rounds} broker alive={alive} restart={restart:.2f}s")
    for name, n in sorted(stats.cases.items()):
        print(f"  {name:<28} {n:>6}")
    covered = {t for (name, t) in stats.topics if name == "send-bad-topic"}
    print(f"  bad topics sent: {len(covered)}/{len(BAD_TOPICS)}")
    print(f"  answer codes: {dict(sorted(stats.codes.items()))}  closed: {stats.closed}")
    print(f"  silent: {len(stats.silent)}  accepted: {len(stats.accepted)}  left open: {len(stats.left_open)}"
          f"  unexplained: {sum(stats.unexplained.values())}")
    ok = alive and stats.ok and not stats.unexplained
    print("RESULT: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m txbroker.bench.chaos.fuzz", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    sys.exit(asyncio.run(_main(args.rounds, args.seed)))

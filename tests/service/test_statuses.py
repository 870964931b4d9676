"""The status tables: every store status has its wire answer, and nothing compares names."""

from __future__ import annotations

import re
from pathlib import Path

from txbroker.remoting.codes import ResponseCode
from txbroker.service.processors.statuses import GET_ANSWERS, PUT_ANSWERS
from txbroker.store.message_store import GetStatus, PutResult, PutStatus

PACKAGE = Path(__file__).resolve().parent.parent.parent / "txbroker"


def test_every_put_status_is_mapped() -> None:
    assert set(PUT_ANSWERS) == set(PutStatus)
    for status, (code, remark) in PUT_ANSWERS.items():
        stored = PutResult(status).ok
        # A stored message is answered with the send result, anything else is a refusal
        # that must say why even when the store gave no reason.
        assert (code in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT,
                         ResponseCode.FLUSH_SLAVE_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE)) == stored, status
        assert stored or remark, status


def test_every_get_status_is_mapped() -> None:
    assert set(GET_ANSWERS) == set(GetStatus)
    pull_codes = {ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_OFFSET_MOVED,
                  ResponseCode.PULL_RETRY_IMMEDIATELY}
    for status, (code, remark) in GET_ANSWERS.items():
        if status is GetStatus.FOUND:
            assert (code, remark) == (ResponseCode.SUCCESS, None)
        else:  # RocketMQ's remark is the status's name
            assert code in pull_codes and remark == status.name, status


def test_no_status_is_compared_by_its_name() -> None:
    """Statuses map through the tables above; ``status.name`` compared with strings would
    silently miss a renamed or added member.  (The transaction modules still do; they are
    being moved and follow.)"""
    compare = re.compile(r"status\.name\s*(==|!=|\bnot in\b|\bin\b)")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("service/transaction"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if compare.search(line):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)

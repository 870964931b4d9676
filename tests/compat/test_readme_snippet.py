"""The README's "Using RocketMQ clients" snippet runs as written against a real broker."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.needs_cpp

README = Path(__file__).resolve().parents[2] / "README.md"


def snippet() -> str:
    text = README.read_text()
    section = text.split("## Using RocketMQ clients", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


async def test_readme_snippet_sends_and_consumes(broker, tmp_path):
    code = snippet()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    code = code.replace("127.0.0.1:9876", broker.namesrv_addr)
    # Let the push consumer receive the message, then stop both cleanly.
    code += "import time\ntime.sleep(3)\nconsumer.shutdown()\nproducer.shutdown()\n"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env={**os.environ, "HOME": str(tmp_path)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 25)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    lines = out.decode().splitlines()
    assert "0" in lines  # the send result's queue offset on a fresh topic
    assert any(line.endswith("""b'{"id": 1}'""") for line in lines), lines

"""RocketMQ 4.x remoting: sans-IO frame codec, codes, typed headers and bodies, asyncio transport."""

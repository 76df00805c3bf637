"""A userspace TCP relay for the network tests (this kernel's ``tc`` has no ``netem``): forwards
``--listen`` to ``--upstream`` and adds what a real network or a load balancer does.

* ``--delay-ms D --jitter-ms J``: every chunk waits D ± J ms (uniform) before it goes on, in each
  direction, in order (a chunk never overtakes the one before it);
* ``--idle-close-s S``: a connection with no byte either way for S seconds is closed both ways,
  as a load balancer's idle timeout does (a line ``idle close`` on stderr for each).

Prints ``relay listening`` on stderr once it listens. Run it inside a network namespace:
``ip netns exec NS python tests/netrelay.py --listen 10.77.0.2:8080 --upstream 127.0.0.1:8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time


async def pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float, jitter_s: float, touch
) -> None:
    """Copy ``reader`` to ``writer``, each chunk held ``delay_s`` ± ``jitter_s``, in order."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def send() -> None:
        while True:
            at, data = await queue.get()
            if data is None:
                break
            wait = at - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    last = 0.0
    try:
        while True:
            data = await reader.read(65536)
            touch()
            if not data:
                break
            at = max(loop.time() + delay_s + random.uniform(-jitter_s, jitter_s), last)
            last = at
            queue.put_nowait((at, data))
    except OSError:
        pass
    finally:
        queue.put_nowait((0.0, None))
        try:
            await sender
        except OSError:
            pass


async def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--idle-close-s", type=float, default=0.0)
    a = p.parse_args(argv)
    lhost, lport = a.listen.rsplit(":", 1)
    uhost, uport = a.upstream.rsplit(":", 1)
    delay, jitter = a.delay_ms / 1e3, a.jitter_ms / 1e3

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(uhost, int(uport))
        except OSError:
            cw.transport.abort()
            return
        seen = [time.monotonic()]

        def touch() -> None:
            seen[0] = time.monotonic()

        tasks = [
            asyncio.create_task(pipe(cr, uw, delay, jitter, touch)),
            asyncio.create_task(pipe(ur, cw, delay, jitter, touch)),
        ]
        if a.idle_close_s > 0:

            async def idle_close() -> None:
                while not all(t.done() for t in tasks):
                    await asyncio.sleep(0.05)
                    if time.monotonic() - seen[0] >= a.idle_close_s:
                        print("idle close", file=sys.stderr, flush=True)
                        cw.transport.close()
                        uw.transport.close()
                        return

            tasks.append(asyncio.create_task(idle_close()))
        await asyncio.gather(*tasks, return_exceptions=True)

    server = await asyncio.start_server(handle, lhost, int(lport), backlog=1024)
    print("relay listening", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))

"""Latency without netem (not in this kernel): a TCP relay that holds every byte for a fixed
time in each direction before passing it on, in order. A device connects to the relay instead
of the broker; each connection gets its own connection to ``target``. With ``delay_s`` = 0.15
the device sees a 300 ms round trip on top of the link's own. Used by bench/netns.py and
tests/integration/netns_round.py.

Decision: the relay runs an asyncio loop on a thread of the test's process, listens on an
address the test made (the namespace's veth peer) and buffers without bound (a test relay: the
bytes in flight are one MQTT session's); a connection closed on one side is closed on the
other after the same delay, so a disconnect is seen late, as over a slow link.
"""

from __future__ import annotations

import asyncio
import threading
import time


class DelayRelay:
    """Listen on ``host`` (a free port: ``port``), relay to ``target`` (host, port), each byte
    ``delay_s`` seconds late each way. A context manager: listening on enter, closed on exit."""

    def __init__(self, host: str, target: tuple[str, int], delay_s: float) -> None:
        self.host, self.target, self.delay_s = host, target, delay_s
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> DelayRelay:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, self.host, 0), self._loop).result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc) -> None:
        async def stop() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each piece ``delay_s`` after it was read (in order)."""
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            try:
                while data := await reader.read(65536):
                    held.put_nowait((time.monotonic() + self.delay_s, data))
            except OSError:
                pass
            held.put_nowait((time.monotonic() + self.delay_s, b""))  # EOF, as late as the bytes

        reading = asyncio.ensure_future(read())
        try:
            while True:
                due, data = await held.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            reading.cancel()
            writer.close()

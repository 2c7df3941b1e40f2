#!/usr/bin/env python3
"""Connection load for an OpenAI-compatible HTTP server (tools/bench-gateway.sh): IDLE
keep-alive connections (each answers one GET /health, then sits), then STREAMS streamed
completions kept open at once (each connection starts the next as one ends), until
SIGTERM. Stage lines go to STATUS as they are reached ("idle N", "streams M"); the last
line, at the end, is a JSON summary.

Usage: gateway-load.py HOST:PORT IDLE STREAMS STATUS MODEL [MAX_TOKENS]
"""
import asyncio, json, resource, signal, sys

host, port = sys.argv[1].rsplit(":", 1)
port = int(port)
n_idle, n_streams, status_path, model = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
max_tokens = int(sys.argv[6]) if len(sys.argv) > 6 else 128
body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 1,
                   "ignore_eos": True, "stream": True}).encode()
stream_req = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n").encode() + body
health_req = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
stats = {"idle_open": 0, "idle_failed": 0, "idle_closed_by_server": 0, "streams_done": 0, "streams_failed": 0,
         "stream_statuses": {}}
stop = asyncio.Event()


def note(line):
    with open(status_path, "a") as f:
        f.write(line + "\n")


async def idle_one(sem, held):
    async with sem:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
            w.write(health_req)
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 30)
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await asyncio.wait_for(r.readexactly(length), 30)
            held.append((r, w))
            stats["idle_open"] += 1
        except Exception:
            stats["idle_failed"] += 1


async def stream_loop(ready):
    first = True
    while not stop.is_set():
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        except Exception:
            stats["streams_failed"] += 1
            await asyncio.sleep(0.5)
            continue
        try:
            while not stop.is_set():
                w.write(stream_req)
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 120)
                code = head.split(b" ", 2)[1].decode()
                stats["stream_statuses"][code] = stats["stream_statuses"].get(code, 0) + 1
                if first:
                    first = False
                    ready.set()
                if code != "200":
                    stats["streams_failed"] += 1
                    await asyncio.sleep(0.5)
                    break
                # Read to the end of the stream (chunked: the zero-length chunk).
                tail = b""
                while not tail.endswith(b"0\r\n\r\n"):
                    chunk = await asyncio.wait_for(r.read(65536), 120)
                    if not chunk:
                        raise ConnectionError("closed mid-stream")
                    tail = (tail + chunk)[-16:]
                stats["streams_done"] += 1
        except Exception:
            if first:
                first = False
                ready.set()
            stats["streams_failed"] += 1
        finally:
            w.close()


async def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    held = []
    sem = asyncio.Semaphore(500)
    await asyncio.gather(*(idle_one(sem, held) for _ in range(n_idle)))
    note(f"idle {stats['idle_open']}")
    readies = [asyncio.Event() for _ in range(n_streams)]
    tasks = [asyncio.create_task(stream_loop(e)) for e in readies]
    for e in readies:
        await e.wait()
    note(f"streams {n_streams}")
    await stop.wait()
    # Still open? A read that would return at once only if the server closed it.
    for r, w in held:
        try:
            data = await asyncio.wait_for(r.read(1), 0.001)
            if data == b"":
                stats["idle_closed_by_server"] += 1
        except asyncio.TimeoutError:
            pass
    for t in tasks:
        t.cancel()
    note(json.dumps(stats))


asyncio.run(main())

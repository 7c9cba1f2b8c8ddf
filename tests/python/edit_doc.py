"""A Python tool editing a Quire document over the y-websocket protocol, with the Python Yjs
stack from PyPI: pycrdt (the Yjs CRDT, Rust's yrs underneath), pycrdt-websocket's channel
over httpx-ws.

Usage: python edit_doc.py WS_URL NAME TEXT EXPECT [TIMEOUT_S]
Connects to WS_URL/NAME, appends TEXT to the text root `content`, waits (at most TIMEOUT_S)
until that root contains every string of EXPECT (comma-separated; the other clients'
edits), then prints the text it ended with as JSON and exits 0; exits 1 on a timeout.
"""

import json
import sys

import anyio
from httpx_ws import aconnect_ws
from pycrdt import Doc, Provider, Text
from pycrdt.websocket.websocket import HttpxWebsocket


async def main(url: str, name: str, text: str, expect: list[str], timeout: float) -> int:
    doc = Doc()
    content = doc.get("content", type=Text)
    async with aconnect_ws(f"{url}/{name}") as ws:
        async with Provider(doc, HttpxWebsocket(ws, name)) as provider:
            with anyio.fail_after(timeout):
                await provider.synced.wait()
            content += text
            try:
                with anyio.fail_after(timeout):
                    while not all(e in str(content) for e in expect):
                        await anyio.sleep(0.05)
            except TimeoutError:
                print(json.dumps({"timeout": True, "text": str(content)}))
                return 1
            # Give the provider a moment to send what it has queued before leaving.
            await anyio.sleep(0.5)
    print(json.dumps({"text": str(content)}))
    return 0


if __name__ == "__main__":
    url, name, text, expect = sys.argv[1:5]
    timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0
    sys.exit(anyio.run(main, url, name, text, [e for e in expect.split(",") if e], timeout))

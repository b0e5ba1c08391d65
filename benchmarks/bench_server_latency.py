#!/usr/bin/env python3
"""How long `loopaudit server` takes to publish diagnostics for an edited 1,000-line training script,
warm (the issue's goal: within 0.5 s). Measured through a real LSP client over stdio (pygls's), from
the didChange notification to the publishDiagnostics that answers it, after the document was opened
(which scans its project and fills the cache).

The script: fixtures/nanogpt_style.py with helper functions appended until it is 1,000 lines; each
edit changes one line of the training loop.

    python benchmarks/bench_server_latency.py            # 20 edits, median and worst
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "nanogpt_style.py"
EDITS = 20


def thousand_lines() -> str:
    text = FIXTURE.read_text()
    number = 0
    while text.count("\n") < 1000:
        text += f"\n\ndef helper_{number}(values):\n    total = 0\n    for value in values:\n        total += value * {number}\n    return total\n"
        number += 1
    return text


async def measure() -> list[float]:
    client = LanguageClient("bench", "1")
    received: asyncio.Queue = asyncio.Queue()

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def published(params: types.PublishDiagnosticsParams) -> None:
        received.put_nowait((time.perf_counter(), len(params.diagnostics)))

    await client.start_io(sys.executable, "-m", "loopaudit", "server")
    await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities()))
    client.initialized(types.InitializedParams())
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.py"
        text = thousand_lines()
        path.write_text(text)
        uri = path.as_uri()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
        )
        await received.get()
        times = []
        for version in range(2, EDITS + 2):
            edited = text.replace("loss.backward()", f"loss.backward()  # edit {version}", 1)
            started = time.perf_counter()
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(version=version, uri=uri),
                    [types.TextDocumentContentChangeWholeDocument(text=edited)],
                )
            )
            arrived, _ = await received.get()
            times.append(arrived - started)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return times


def main() -> int:
    times = asyncio.run(measure())
    lines = thousand_lines().count("\n")
    print(
        f"{lines}-line script, {len(times)} edits: median {statistics.median(times) * 1000:.0f} ms, "
        f"worst {max(times) * 1000:.0f} ms (goal: 500 ms)"
    )
    return 0 if statistics.median(times) < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())

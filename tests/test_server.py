"""`loopaudit server`, driven by a real LSP client (pytest-lsp) over stdio, as an editor drives it: it
answers `initialize`, publishes for an opened training script the findings `loopaudit scan` reports,
follows edits, offers the safe fixes as quick fixes and shows a rule's docs on hover."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("pygls", reason="`loopaudit server` needs pygls (pip install 'loopaudit[lsp]')")
pytest_lsp = pytest.importorskip("pytest_lsp")

from lsprotocol import types  # noqa: E402  (after the skips)
from pytest_lsp import ClientServerConfig, LanguageClient  # noqa: E402

from .conftest import loopaudit_command, run_cli  # noqa: E402
from .test_cli_habits import SCRIPT  # noqa: E402  (a script with fixable and unfixable findings)


def loopaudit_server() -> list[str]:
    executable = loopaudit_command()[0]
    return [executable, "server"] if shutil.which(executable) else [sys.executable, "-m", "loopaudit", "server"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


@pytest_lsp.fixture(config=ClientServerConfig(server_command=loopaudit_server()))
async def client(lsp_client: LanguageClient):
    await lsp_client.initialize_session(types.InitializeParams(capabilities=types.ClientCapabilities()))
    yield
    await lsp_client.shutdown_session()


async def opened(client: LanguageClient, path: Path, text: str | None = None) -> list[types.Diagnostic]:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=text if text is not None else path.read_text()
            )
        )
    )
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return client.diagnostics[uri]


@pytest.mark.asyncio
async def test_an_opened_script_gets_the_findings_the_scan_reports(client: LanguageClient, project: Path):
    diagnostics = await opened(client, project / "train.py")
    scanned = json.loads(run_cli("scan", "train.py", "--output-format", "json", cwd=project).out)
    assert [(d.code, d.range.start.line + 1, d.range.start.character + 1) for d in diagnostics] == [
        (f["code"], f["location"]["row"], f["location"]["column"]) for f in scanned
    ]
    assert all(d.source == "loopaudit" for d in diagnostics)
    (item,) = [d for d in diagnostics if d.code == "LA101"]
    assert "copies a GPU value to the host" in item.message and "step loop `for x in loader`" in item.message
    assert item.code_description.href.endswith("#la101-item-in-step")


@pytest.mark.asyncio
async def test_an_edit_is_analysed_as_typed(client: LanguageClient, project: Path):
    path = project / "train.py"
    await opened(client, path)
    uri = path.as_uri()
    fixed = SCRIPT.replace("print(loss.item())", "pass")
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
        )
    )
    await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert "LA101" not in {d.code for d in client.diagnostics[uri]}
    assert "LA202" in {d.code for d in client.diagnostics[uri]}


@pytest.mark.asyncio
async def test_safe_fixes_are_quick_fixes_and_hover_shows_the_rule(client: LanguageClient, project: Path):
    path = project / "train.py"
    diagnostics = await opened(client, path)
    (copy,) = [d for d in diagnostics if d.code == "LA202"]
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=path.as_uri()),
            range=copy.range,
            context=types.CodeActionContext(diagnostics=[copy]),
        )
    )
    (action,) = [a for a in actions if a.title.startswith("LA202")]
    (edit,) = action.edit.changes[path.as_uri()]
    assert "non_blocking=True" in edit.new_text
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=path.as_uri()), position=copy.range.start)
    )
    assert hover is not None and "blocking-batch-copy" in hover.contents.value


@pytest.mark.asyncio
async def test_a_notebook_gets_each_cell_s_findings_as_scan_reports_them(client: LanguageClient, tmp_path: Path):
    from .test_notebooks import MODEL, SETUP, STEP, write_notebook

    write_notebook(tmp_path)
    scanned = json.loads(run_cli("scan", "train.ipynb", "--output-format", "json", cwd=tmp_path).out)
    notebook_uri = (tmp_path / "train.ipynb").as_uri()
    sources = [
        (types.NotebookCellKind.Markup, "# Training on the GPU"),
        *[(types.NotebookCellKind.Code, s) for s in (SETUP, MODEL, STEP, "!nvidia-smi")],
    ]
    cell_uris = [f"vscode-notebook-cell:{tmp_path / 'train.ipynb'}#cell{number}" for number in range(len(sources))]
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=notebook_uri,
                notebook_type="jupyter-notebook",
                version=1,
                cells=[types.NotebookCell(kind=kind, document=uri) for (kind, _), uri in zip(sources, cell_uris)],
            ),
            cell_text_documents=[
                types.TextDocumentItem(
                    uri=uri,
                    language_id="python" if kind == types.NotebookCellKind.Code else "markdown",
                    version=1,
                    text=text,
                )
                for (kind, text), uri in zip(sources, cell_uris)
            ],
        )
    )
    deadline = 60
    while cell_uris[3] not in client.diagnostics and deadline:
        await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        deadline -= 1
    published = sorted(
        (number + 1, d.code, d.range.start.line + 1, d.range.start.character + 1)
        for number, uri in enumerate(cell_uris)
        for d in client.diagnostics.get(uri, [])
    )
    assert published == sorted((f["cell"], f["code"], f["location"]["row"], f["location"]["column"]) for f in scanned)
    assert published  # the step cell's sync and copy

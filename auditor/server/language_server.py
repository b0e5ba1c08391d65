"""The Language Server: pygls over stdio.

- textDocument/didOpen, didSave: the document's project scanned (workspace.py), diagnostics
  published for every open document of it.
- textDocument/didChange: the edited text analysed with its project's facts; diagnostics published.
- textDocument/codeAction: each safe fix of a diagnostic in the range, as a quick fix.
- textDocument/hover: the documentation of the rule reported where the cursor is.
- didClose: the document's diagnostics cleared.

- notebookDocument/didOpen, didChange, didSave: the notebook's code cells analysed together (as
  `loopaudit scan` analyses a notebook file), each cell's diagnostics published at its own lines.

The configuration is the one `loopaudit scan` reads for the file (pyproject.toml or loopaudit.toml
above it).
"""

from __future__ import annotations

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from loopaudit import __version__
from loopaudit.rule_api.docs import rule_markdown
from loopaudit.rule_api.registry import rule_by_code
from loopaudit.server.protocol_shapes import covers, diagnostic, fix_action
from loopaudit.server.workspace import Workspace


def build_server() -> LanguageServer:
    server = LanguageServer(
        "loopaudit",
        __version__,
        text_document_sync_kind=types.TextDocumentSyncKind.Full,
        notebook_document_sync=types.NotebookDocumentSyncOptions(
            notebook_selector=[
                types.NotebookDocumentFilterWithCells(
                    notebook="jupyter-notebook", cells=[types.NotebookCellLanguage(language="python")]
                )
            ],
            save=True,
        ),
    )
    workspace = Workspace()

    def lines_of(uri: str) -> list[str]:
        document = workspace.documents[uri]
        return document.text.split("\n")

    def publish(uris) -> None:
        for uri in uris:
            document = workspace.documents.get(uri)
            if document is None:
                continue
            lines = lines_of(uri)
            server.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(
                    uri=uri, diagnostics=[diagnostic(finding, lines, uri) for finding in document.findings]
                )
            )
        if workspace.problem is not None:
            server.window_show_message(
                types.ShowMessageParams(type=types.MessageType.Error, message=f"loopaudit: {workspace.problem}")
            )
            workspace.problem = None

    def opened(uri: str, text: str) -> None:
        path = to_fs_path(uri)
        if path is None or not workspace.analysable(path):
            return
        publish(workspace.open(uri, path, text))

    def notebook_changed(notebook_uri: str) -> None:
        """Every code cell of the notebook analysed together, each cell's diagnostics published."""
        notebook = server.workspace.get_notebook_document(notebook_uri=notebook_uri)
        path = to_fs_path(notebook_uri)
        if notebook is None or path is None:
            return
        cells = [
            (
                cell.document,
                cell.kind == types.NotebookCellKind.Code,
                server.workspace.get_text_document(cell.document).source,
            )
            for cell in notebook.cells
        ]
        for cell_uri, findings in workspace.notebook(path, cells).items():
            lines = server.workspace.get_text_document(cell_uri).source.split("\n")
            workspace.cells[cell_uri] = (lines, findings)
            server.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(
                    uri=cell_uri, diagnostics=[diagnostic(finding, lines, cell_uri) for finding in findings]
                )
            )

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
    def notebook_did_open(params: types.DidOpenNotebookDocumentParams) -> None:
        notebook_changed(params.notebook_document.uri)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
    def notebook_did_change(params: types.DidChangeNotebookDocumentParams) -> None:
        notebook_changed(params.notebook_document.uri)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
    def notebook_did_save(params: types.DidSaveNotebookDocumentParams) -> None:
        notebook_changed(params.notebook_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: types.DidOpenTextDocumentParams) -> None:
        opened(params.text_document.uri, params.text_document.text)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(params: types.DidSaveTextDocumentParams) -> None:
        uri = params.text_document.uri
        document = workspace.documents.get(uri)
        if document is not None:
            opened(uri, document.text)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        if uri not in workspace.documents:
            return
        text = server.workspace.get_text_document(uri).source
        workspace.change(uri, text)
        publish([uri])

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        workspace.close(uri)
        server.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION, types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix])
    )
    def code_action(params: types.CodeActionParams) -> list[types.CodeAction]:
        uri = params.text_document.uri
        shown = workspace.shown(uri)
        if shown is None:
            return []
        lines, findings = shown
        actions = []
        wanted = params.range
        for finding in findings:
            displayed = diagnostic(finding, lines, uri)
            if displayed.range.end.line < wanted.start.line or displayed.range.start.line > wanted.end.line:
                continue
            action = fix_action(finding, lines, uri, displayed)
            if action is not None:
                actions.append(action)
        return actions

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(params: types.HoverParams) -> types.Hover | None:
        shown = workspace.shown(params.text_document.uri)
        if shown is None:
            return None
        lines, findings = shown
        codes = dict.fromkeys(f.code for f in findings if covers(f, lines, params.position))
        rules = [rule for rule in map(rule_by_code, codes) if rule is not None]
        if not rules:
            return None
        text = "\n\n---\n\n".join(rule_markdown(rule) for rule in rules)
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text))

    return server


def serve() -> None:
    build_server().start_io()

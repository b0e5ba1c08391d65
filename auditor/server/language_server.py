"""The Language Server: pygls over stdio.

- textDocument/didOpen, didSave: the document's project scanned (workspace.py), diagnostics
  published for every open document of it.
- textDocument/didChange: the edited text analysed with its project's facts; diagnostics published.
- textDocument/codeAction: each safe fix of a diagnostic in the range, as a quick fix.
- textDocument/hover: the documentation of the rule reported where the cursor is.
- didClose: the document's diagnostics cleared.

The configuration is the one `loopaudit scan` reads for the file (pyproject.toml or loopaudit.toml
above it). Python files are served; a notebook opened as a document is left to `loopaudit scan`.
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
    server = LanguageServer("loopaudit", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Full)
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
        document = workspace.documents.get(uri)
        if document is None:
            return []
        lines = lines_of(uri)
        actions = []
        wanted = params.range
        for finding in document.findings:
            shown = diagnostic(finding, lines, uri)
            if shown.range.end.line < wanted.start.line or shown.range.start.line > wanted.end.line:
                continue
            action = fix_action(finding, lines, uri, shown)
            if action is not None:
                actions.append(action)
        return actions

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(params: types.HoverParams) -> types.Hover | None:
        uri = params.text_document.uri
        document = workspace.documents.get(uri)
        if document is None:
            return None
        lines = lines_of(uri)
        codes = dict.fromkeys(f.code for f in document.findings if covers(f, lines, params.position))
        rules = [rule for rule in map(rule_by_code, codes) if rule is not None]
        if not rules:
            return None
        text = "\n\n---\n\n".join(rule_markdown(rule) for rule in rules)
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=text))

    return server


def serve() -> None:
    build_server().start_io()

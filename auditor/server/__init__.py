"""`loopaudit server`: the scan as a Language Server (LSP over stdio), for editors. language_server.py
wires the protocol (pygls); workspace.py keeps what the scan knows of the open documents and their
projects; protocol_shapes.py turns findings into diagnostics, code actions and hovers."""

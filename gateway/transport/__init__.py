"""Bytes on sockets: the acceptor, the HTTP server (http_server/) and the
HTTP/1.1 upstream client (http_client/). Knows no protocol.
"""

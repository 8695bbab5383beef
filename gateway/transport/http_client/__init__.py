"""The one HTTP/1.1 client of the HTTP upstreams: pool.py (UpstreamHttp:
keep-alive connections per endpoint, requests written, streamed replies),
connection.py (one connection: httptools replies, bounds, named failures),
reply.py (UpstreamReply and its headers).
"""

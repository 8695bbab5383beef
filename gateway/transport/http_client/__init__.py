"""The one HTTP/1.1 client of the HTTP upstreams: keep-alive pools per
endpoint, httptools replies, named failures.
"""

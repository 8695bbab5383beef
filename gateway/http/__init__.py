"""The server side of HTTP: the request and reply every hot handler is
written against (exchange.py), and the fast HTTP/1.1 protocol on httptools
that serves them (fast.py), beside the aiohttp application on the same port
(gateway/httpserver.py) that serves everything else."""

"""The server side of HTTP, one module per concern (the base of every HTTP
protocol's listener, HttpFrontend, is gateway/protocols/http_frontend.py):

- exchange.py: the request and reply every hot handler is written against;
- fast.py: the fast HTTP/1.1 path (httptools), first on every connection;
- aiohttp_app.py: the aiohttp application behind it on the same port;
- guard.py: the listener's limits both servers share;
- body.py: request bodies inflated under the limit, answer codings.
"""

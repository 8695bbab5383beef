"""Protocol adapters: one package per wire protocol, each with a codec (pure
functions, both directions), its error table (errors.py), a frontend
(downstream listener) and/or a backend (upstream client), exported as
FRONTEND, BACKEND and ERRORS. ``registry`` names them for the config; no
protocol imports another (``base`` and ``upstream`` are what they share)."""

"""Protocol adapters: one package per wire protocol, each with a codec
(pure functions), a frontend (downstream listener) and/or a backend
(upstream client). ``registry`` names them for the config."""

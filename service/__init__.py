"""The recommendation service: FastAPI app, offline scoring commands and a Python client.

Laid out after fastapi/full-stack-fastapi-template: ``core/`` (settings, model store, admission, worker
processes, limits, metrics), ``schemas.py``, ``routes/<resource>.py`` (thin routers over ``engine.py``,
``scoring.py`` and ``tables.py``), ``main.py`` (the app), ``commands.py`` (``ficco serve``, ``score``,
``recommend``), ``client.py`` (for runtimes). No torch anywhere: ``pip install '.[service]'``.
"""

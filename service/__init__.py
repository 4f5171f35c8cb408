"""The recommendation service: FastAPI app, offline scoring commands and a Python client.

Layout (after fastapi/full-stack-fastapi-template): ``core/`` (settings, the model store with hot
reload, micro-batching of predictions, the batch worker processes and their admission, request limits
and metrics), ``schemas.py`` (request/response families), ``errors.py`` (the 422 item shape),
``engine.py`` and ``scoring.py`` (the logic the routes and the CLI share), ``batch.py`` (a batch body
answered, as the batch workers run it), ``deps.py`` (dependency aliases), ``routes/<resource>.py``
(thin routers), ``main.py`` (the app), ``default_model.py`` (training the default model on an empty registry),
``commands.py`` (``ficco serve``, ``ficco score``, ``ficco recommend``), ``report.py`` (their tables and
CSV), ``client.py`` (httpx client for runtimes).

No torch anywhere: the service installs with ``pip install '.[service]'``.
"""

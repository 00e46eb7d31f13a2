"""jaxspec.serve: an OpenAI-compatible HTTP server (aiohttp) over the continuous-batching core
(``jaxspec.serving.ServingEngine``).

``python -m jaxspec.serve --model PATH`` (console script ``jaxspec-serve``; ``cli``) serves
``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health`` and ``/metrics``.
``build_app(serving_engine, tokenizer, model_name)`` is the ``aiohttp.web.Application``;
``ServerThread(app)`` runs one on a background thread of its own (``.url``, ``.stop()``).
The ``ServingEngine`` is owned by one thread, the ``EngineDriver`` (``driver``)."""

from jaxspec.serve.app import build_app as build_app
from jaxspec.serve.app import ServerThread as ServerThread
from jaxspec.serve.driver import EngineDriver as EngineDriver

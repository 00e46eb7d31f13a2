"""``python -m jaxspec.serve``: the OpenAI-compatible server (``jaxspec.serve.cli``)."""

from jaxspec.serve.cli import main

raise SystemExit(main())

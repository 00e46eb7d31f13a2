"""``python -m jaxspec.serve`` / ``jaxspec-serve``: load a model (and a draft head), build the serving core, and
serve it over HTTP (``jaxspec.serve.app``) until interrupted. Prints one line when ready: the URL."""

import argparse
import sys

from jaxspec.cli_help import parser as cli_parser
from jaxspec.serve.app import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES
from jaxspec.serve.driver import DEFAULT_MAX_QUEUED_REQUESTS


def _spec(s: str):
    parts = s.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected STEPS,TOPK,TOKENS (three ints), got {s!r}")
    return tuple(int(p) for p in parts)


def parser() -> argparse.ArgumentParser:
    p = cli_parser("jaxspec.serve", "An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, "
                                    "/v1/models, /health, /metrics) over jaxspec's continuous-batching core, with "
                                    "speculative decoding.")
    p.add_argument("--model", required=True, help="a checkpoint directory, a .gguf file or a registered name "
                                                  "(e.g. smollm2-135m-instruct, fetched once)")
    p.add_argument("--draft", help="a draft head directory (EAGLE-3 or MTP); without it: plain decoding")
    p.add_argument("--draft-kind", choices=("eagle3", "mtp"), help="the head's kind (default: read from --draft)")
    p.add_argument("--spec", type=_spec, action="append",
                   help="a draft shape STEPS,TOPK,TOKENS (repeat for several, with --adaptive); default 3,1,4")
    p.add_argument("--adaptive", action="store_true", help="pick among the --spec shapes (and plain) per round")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=int, default=8000, help="the TCP port to listen on")
    p.add_argument("--max-batch", type=int, default=8, help="batch slots")
    p.add_argument("--max-context", type=int, default=2048, help="tokens per request (prompt + reply)")
    p.add_argument("--page-size", type=int, default=16, help="KV page size in tokens")
    p.add_argument("--num-pages", type=int, help="KV pool in pages (default: max-batch full requests)")
    p.add_argument("--rounds-per-step", type=int, default=4, help="decode rounds per serving step")
    p.add_argument("--dtype", choices=("bf16", "f32"), default="f32", help="weight dtype")
    p.add_argument("--served-model-name", help="the name clients send as `model` (default: --model)")
    p.add_argument("--max-queued-requests", type=int, default=DEFAULT_MAX_QUEUED_REQUESTS,
                   help="requests that may wait beyond the free batch slots; one more is refused (HTTP 429)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="largest request body (HTTP 413 above)")
    p.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S,
                   help="seconds to receive a request's whole body (HTTP 408 after)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="batch-invariant forwards (Engine(batch_invariant=True)): a reply does not depend on the "
                        "requests it is batched with, and speculative greedy replies equal plain ones in bf16 too; "
                        "costs speed (docs/serving.md, 'Batch-invariant mode')")
    p.add_argument("--compilation-cache", metavar="DIR",
                   help="keep every compiled executable in DIR (JAX's persistent compilation cache): a restart with "
                        "the same model, options, jax and device loads them instead of compiling its warm-up again")
    p.add_argument("--greedy", action="store_true",
                   help="greedy requests only (temperature 0): the core's greedy executables, which skip the "
                        "sampling work; a request that samples is refused (400)")
    return p


def build(args):
    """``(serving_engine, tokenizer, model_name)`` for parsed ``args``, with a progress line on stderr for each
    stage (fetch, load, warm-up compiles)."""
    import os  # noqa: PLC0415
    import time  # noqa: PLC0415

    from tqdm import tqdm  # noqa: PLC0415

    t0 = time.perf_counter()

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    if args.compilation_cache is not None:  # before anything compiles
        os.makedirs(args.compilation_cache, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", os.path.abspath(args.compilation_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    from jaxspec.config import SpecConfig  # noqa: PLC0415
    from jaxspec.engine import Engine  # noqa: PLC0415
    from jaxspec.models import fetch, head_kind, load_target_with_head  # noqa: PLC0415
    from jaxspec.serving import ServingEngine  # noqa: PLC0415
    from jaxspec.text import Tokenizer  # noqa: PLC0415

    path = str(fetch.fetch_model(args.model)) if args.model in fetch.MODELS else args.model
    if not os.path.exists(path):
        raise SystemExit(f"--model: {args.model!r} is neither a registered name ({sorted(fetch.MODELS)}) nor a path")
    dtype = jnp.bfloat16 if args.dtype == "bf16" else jnp.float32
    tok = Tokenizer.from_file(path)
    spec = None
    kind = None if args.draft is None else args.draft_kind or head_kind(args.draft, arg="--draft")
    steps = max(s[0] for s in args.spec or [(3, 1, 4)]) if kind == "mtp" else None
    target, drafter, _ = load_target_with_head(path, args.draft, kind=kind, param_dtype=dtype, num_draft_steps=steps)
    if drafter is not None:
        specs = [SpecConfig(*s) for s in (args.spec or [(3, 1, 4)])]
        spec = specs if len(specs) > 1 else specs[0]
    eng = Engine(target, drafter, spec=spec, max_context=args.max_context, page_size=args.page_size,
                 max_batch=args.max_batch, num_pages=args.num_pages, adaptive=True if args.adaptive else None,
                 batch_invariant=args.batch_invariant)
    se = ServingEngine(eng, rounds_per_step=args.rounds_per_step, sampling=not args.greedy)
    _say(f"loaded in {time.perf_counter() - t0:.1f} s; compiling every executable a step can run")
    with tqdm(desc="jaxspec-serve: warm-up", unit="executable", file=sys.stderr, total=0) as bar:
        def progress(done, total, what):
            bar.total = total
            bar.n = done
            bar.set_postfix_str(what, refresh=False)
            bar.refresh()

        se.warmup(progress=progress)  # every executable compiled before the first request: no step compiles later
    return se, tok, args.served_model_name or args.model


def _say(msg: str) -> None:
    print(f"jaxspec-serve: {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    _say(f"loading {args.model}" + ("" if args.draft is None else f" with the draft head {args.draft}")
         + " (imports, then the model)")
    from aiohttp import web  # noqa: PLC0415

    from jaxspec.serve.app import build_app  # noqa: PLC0415

    se, tok, name = build(args)
    app = build_app(se, tok, name, max_queued_requests=args.max_queued_requests, max_body_bytes=args.max_body_bytes,
                    body_timeout_s=args.body_timeout)

    async def ready(app):
        print(f"jaxspec-serve: serving {name} on http://{args.host}:{args.port}", flush=True)

    app.on_startup.append(ready)
    web.run_app(app, host=args.host, port=args.port, print=None, handler_cancellation=True,
                handle_signals=True, access_log=None)
    return 0

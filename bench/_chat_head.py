"""SmolLM2-135M-Instruct (float32, fetched when missing) with a draft head, and the chat prompts of
``jaxspec.data.chat_prompts`` through its chat template: what the draft-head checks (``draft_consistency.py``,
``draft_mtp_consistency.py``, ``draft_train_metric.py``) run on, loaded as ``python -m jaxspec.demo`` loads it."""

import os
from typing import NamedTuple

import _cli

MODEL = "smollm2-135m-instruct"
MTP_STEPS = 3  # the draft steps an MTP head is loaded with (the demo's most)


class ChatHead(NamedTuple):
    """The target, its drafter, the chat prompts as token ids, the end-of-turn id and the GGUF's path."""

    target: object
    drafter: object
    prompts: list
    eos_id: int | None
    gguf: str


def load_chat_head(head: str | None, kind: str, num_prompts: int) -> ChatHead:
    """SmolLM2 with the draft head ``head`` (default: the one shipped for it) of ``kind`` (``"eagle3"`` or
    ``"mtp"``; a head of another kind is refused, naming ``--head``), and the first ``num_prompts`` chat prompts."""
    import jax.numpy as jnp

    from jaxspec.data.chat_prompts import CHAT_PROMPTS
    from jaxspec.models import fetch_model, head_kind, load_target_with_head, shipped_head
    from jaxspec.text import Tokenizer

    head = shipped_head(MODEL, kind) if head is None else head
    found = head_kind(head, arg="--head")
    if found != kind:
        raise SystemExit(f"--head {head}: expected an {kind} head, found an {found} one")
    gguf = str(fetch_model(MODEL, quiet=True))
    tok = Tokenizer.from_file(gguf)
    target, drafter, _ = load_target_with_head(gguf, head, kind=kind, param_dtype=jnp.float32,
                                               num_draft_steps=MTP_STEPS if kind == "mtp" else None)
    prompts = [tok.encode_chat([{"role": "user", "content": t}], add_generation_prompt=True)
               for t in CHAT_PROMPTS[:num_prompts]]
    eot, stops = tok.end_of_turn_token_id, tok.chat_stop_token_ids
    return ChatHead(target, drafter, prompts, eot if eot is not None else (min(stops) if stops else None), gguf)


def check_parser(script: str, doc: str, kind: str, num_prompts: int):
    """The draft checks' parser: ``--head`` (a ``kind`` head), ``--num-prompts`` (default ``num_prompts``) and
    ``--new-tokens``."""
    ap = _cli.parser(script, doc)
    what = {"eagle3": "EAGLE-3", "mtp": "MTP"}[kind]
    ap.add_argument("--head", default=None, help=f"{what} head directory (default: the shipped SmolLM2 head)")
    ap.add_argument("--num-prompts", type=int, default=num_prompts, help="chat prompts compared")
    ap.add_argument("--new-tokens", type=int, default=64, help="greedy reply tokens per prompt")
    return ap


def load_check(args, kind: str):
    """``(chat_head, spec, engine)`` of a draft check on the CPU (unless ``JAX_PLATFORMS`` says otherwise): SmolLM2
    with the ``kind`` head ``args.head``, the chain ``SpecConfig(3, 1, 4)`` and a plain ``Engine`` that answers
    ``args.num_prompts`` prompts at once."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from jaxspec.config import SpecConfig
    from jaxspec.engine import Engine

    setup = load_chat_head(args.head, kind, args.num_prompts)
    eng = Engine(setup.target, None, max_context=256, page_size=16, max_batch=args.num_prompts, eos_id=setup.eos_id)
    return setup, SpecConfig(3, 1, 4), eng

"""Convert a llama GGUF file once into a Hugging Face checkpoint directory: ``python -m jaxspec.convert
GGUF OUTDIR`` (or ``python -m jaxspec.convert smollm2-135m-instruct OUTDIR`` for a named model, fetched
first). For tools that want a directory. It writes the weights (``jaxspec.models``) and the tokenizer
(``jaxspec.text``), so it sits above both (``jaxspec.models`` never imports ``jaxspec.text``).

Writes, with jaxspec's own writer (``save_model``): ``config.json`` (``DecoderConfig.to_hf()`` plus the GGUF's
``max_position_embeddings`` and special token ids) and ``model.safetensors`` (the dequantized weights in
``--dtype``; the q/k rows in Hugging Face's layout, as ``load_model`` reads them); and
``generation_config.json`` (the GGUF's bos / eos / pad token ids); and the GGUF's own tokenizer
(``jaxspec.text.Tokenizer.from_gguf(...).save``: ``tokenizer.json``, ``tokenizer_config.json`` with the chat
template, ``chat_template.jinja``, ``special_tokens_map.json``; the stop tokens join ``generation_config.json``).
``load_model(OUTDIR)`` then gives the same ``Decoder`` as ``load_model(GGUF)`` (bit for bit at the dtype
written), and ``Tokenizer.from_dir(OUTDIR)`` (or transformers' ``AutoTokenizer``) the same tokenizer.
"""

import argparse
import json
import os
import sys

import jax.numpy as jnp

from jaxspec._gguf import read_gguf_metadata
from jaxspec.models.checkpoint import save_model
from jaxspec.models.fetch import MODELS, fetch_model
from jaxspec.models.gguf import is_gguf, load_gguf, read_gguf_info

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def convert_gguf(path, outdir, *, dtype="float32") -> str:
    """Write GGUF file ``path`` as Hugging Face checkpoint directory ``outdir`` (see the module docstring); returns
    ``outdir``. ``dtype``: ``float32``, ``bfloat16`` or ``float16`` (the tensors' dtype in the safetensors)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
    if not is_gguf(path):
        raise ValueError(f"{path}: not a GGUF file")
    outdir = os.fspath(outdir)
    info = read_gguf_info(path)
    model = load_gguf(path, param_dtype=_DTYPES[dtype])
    save_model(model, outdir, dtype=_DTYPES[dtype],
               metadata={"source": os.path.basename(os.fspath(path)), "converted_by": "jaxspec.convert"})
    cfg_file = os.path.join(outdir, "config.json")
    with open(cfg_file) as f:
        cfg = json.load(f)
    tokens = {k: v for k, v in (("bos_token_id", info.bos_token_id), ("eos_token_id", info.eos_token_id),
                                ("pad_token_id", info.pad_token_id)) if v is not None}
    cfg.update(tokens, torch_dtype=dtype)
    if info.context_length is not None:
        cfg["max_position_embeddings"] = info.context_length
    with open(cfg_file, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with open(os.path.join(outdir, "generation_config.json"), "w") as f:
        json.dump(tokens, f, indent=2, sort_keys=True)
    _write_tokenizer(path, outdir)
    return outdir


def _write_tokenizer(path, outdir) -> None:
    """The GGUF's own tokenizer into ``outdir`` when the file has one; a vocabulary jaxspec.text cannot read is
    reported on stderr (the weights are written either way)."""
    from jaxspec.text.tokenizer import Tokenizer  # noqa: PLC0415

    if "tokenizer.ggml.model" not in read_gguf_metadata(path, ("tokenizer.ggml.model",)):
        return
    try:
        tok = Tokenizer.from_gguf(path)
    except ValueError as e:
        print(f"convert: tokenizer not written: {e}", file=sys.stderr)
        return
    tok.save(outdir)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jaxspec.convert",
                                 description="Convert a llama GGUF file once into a Hugging Face checkpoint "
                                             "directory (weights, config, tokenizer).",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("source", help=f"a .gguf file, or a named model ({', '.join(sorted(MODELS))}) fetched first")
    ap.add_argument("outdir", help="directory to write (created if needed)")
    ap.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="dtype of the written tensors")
    args = ap.parse_args(argv)
    try:
        src = fetch_model(args.source) if args.source in MODELS and not os.path.exists(args.source) else args.source
        print(convert_gguf(src, args.outdir, dtype=args.dtype))
    except (ValueError, OSError, RuntimeError) as e:
        print(f"convert: {e}", file=sys.stderr)
        return 1 if not isinstance(e, ValueError) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Check that jaxspec runs a Hugging Face checkpoint exactly as transformers does.

``python -m jaxspec.interop.check_model DIR`` loads ``DIR`` (``config.json`` + ``*.safetensors``) twice --
with ``transformers`` (torch, CPU, float32) and with ``jaxspec.models.load_model`` (float32 weights and KV,
paged attention through a shuffled page table) -- and compares, on random prompts:

* the prompt logits: ``max |jax - hf| <= rtol * max |hf|`` (default ``rtol = 1e-4``). Both sides compute the
  same f32 graph; they differ only in summation order and in how RoPE frequencies are rounded, which moves
  logits by a few f32 ulps per layer (observed 2-4e-7 relative on the test models). 1e-4 leaves >100x
  headroom for deeper models while any layout error (a dropped bias, the wrong RoPE half, a wrong norm
  epsilon, an untied head) moves logits by 1e-2 or more;
* the greedy continuations: ``--new-tokens`` tokens, identical token for token (jaxspec decodes one token
  per forward from its paged KV cache; transformers with its own KV cache).

Exit status 0 when both hold, 1 when either fails, 2 for a checkpoint jaxspec refuses (the error says why).
Needs the ``hf`` extra (transformers) and torch; nothing is downloaded.
"""

import argparse
import dataclasses
import inspect
import sys

import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """Result of ``check_model``: logit agreement and both greedy continuations (``int[B, new_tokens]``)."""

    max_abs_diff: float
    logit_scale: float
    rtol: float
    greedy_jax: np.ndarray
    greedy_hf: np.ndarray

    @property
    def logits_ok(self) -> bool:
        return self.max_abs_diff <= self.rtol * self.logit_scale

    @property
    def greedy_ok(self) -> bool:
        return np.array_equal(self.greedy_jax, self.greedy_hf)

    @property
    def ok(self) -> bool:
        return self.logits_ok and self.greedy_ok


def _hf_model(path: str):
    import torch
    import transformers

    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype": torch.float32} if major >= 5 else {"torch_dtype": torch.float32}
    return transformers.AutoModelForCausalLM.from_pretrained(path, **kw).eval()


def hf_greedy(path: str, prompts: np.ndarray, new_tokens: int):
    """transformers: ``(prompt logits f32[B, P, V], greedy tokens int[B, new_tokens])``, with its KV cache."""
    import torch

    from jaxspec.interop.dlpack import to_jax

    model = _hf_model(path)
    # transformers >= 5.2x names the KV cache argument and output ``cache`` (``past_key_values`` before).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(prompts.astype(np.int64)), use_cache=True)
        logits = np.asarray(to_jax(out.logits.float()))
        nxt = out.logits[:, -1].argmax(-1)
        toks, past = [nxt], getattr(out, name)
        for _ in range(new_tokens - 1):
            out = model(input_ids=nxt[:, None], use_cache=True, **{name: past})
            nxt, past = out.logits[:, -1].argmax(-1), getattr(out, name)
            toks.append(nxt)
    return logits, torch.stack(toks, 1).numpy()


def jax_greedy(path: str, prompts: np.ndarray, new_tokens: int, *, page_size: int = 4, seed: int = 0):
    """jaxspec: prefill into a paged f32 KV cache, then one token per forward; same outputs as ``hf_greedy``."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec.models.checkpoint import load_model
    from jaxspec.protocols import AttentionMetadata, make_req_to_token, page_table_from_req_to_token

    model = load_model(path, mtp=False, kv_dtype=jnp.float32)
    b, p = prompts.shape
    width = -(-(p + new_tokens) // page_size) * page_size
    r2t = make_req_to_token(b, width, page_size, seed=seed)
    cache = model.make_cache(r2t, (int(r2t.max()) // page_size + 1) * page_size)
    table = page_table_from_req_to_token(cache.req_to_token, page_size)
    fwd = nnx.jit(lambda m, t, meta, c: m.forward(t, meta, c))

    def meta(pos, q):
        positions = pos + jnp.broadcast_to(jnp.arange(q, dtype=jnp.int32)[None], (b, q))
        return AttentionMetadata(
            positions=positions, qmask=jnp.broadcast_to(jnp.tril(jnp.ones((q, q), bool))[None], (b, q, q)),
            prefix_lens=jnp.full((b,), pos, jnp.int32), page_table=table,
            write_locs=jnp.take_along_axis(cache.req_to_token, positions, axis=1), page_size=page_size)

    logits, _, cache = fwd(model, jnp.asarray(prompts, jnp.int32), meta(0, p), cache)
    nxt = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
    toks = [nxt]
    for i in range(new_tokens - 1):
        out, _, cache = fwd(model, nxt[:, None], meta(jnp.int32(p + i), 1), cache)
        nxt = jnp.argmax(out[:, -1], -1).astype(jnp.int32)
        toks.append(nxt)
    return np.asarray(jax.device_get(logits)), np.asarray(jnp.stack(toks, 1))


def check_model(path: str, *, batch: int = 2, prompt_len: int = 16, new_tokens: int = 32, rtol: float = 1e-4,
                page_size: int = 4, seed: int = 0) -> ModelCheck:
    """Compare jaxspec with transformers on checkpoint directory ``path`` (see the module docstring)."""
    from jaxspec.models.checkpoint import read_config

    cfg = read_config(path)
    prompts = np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, prompt_len))
    ref_logits, ref_toks = hf_greedy(path, prompts, new_tokens)
    logits, toks = jax_greedy(path, prompts, new_tokens, page_size=page_size, seed=seed)
    return ModelCheck(max_abs_diff=float(np.max(np.abs(logits - ref_logits))),
                      logit_scale=float(np.max(np.abs(ref_logits))), rtol=rtol, greedy_jax=toks, greedy_hf=ref_toks)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m jaxspec.interop.check_model",
        description="Check that jaxspec runs a Hugging Face checkpoint directory (config.json + *.safetensors) "
                    "like transformers does: prompt logits within rtol and identical greedy continuations. "
                    "Exit 0 on a match, 1 on a mismatch, 2 when jaxspec refuses the checkpoint.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("path", metavar="DIR", help="checkpoint directory (local; nothing is downloaded)")
    ap.add_argument("--batch", type=int, default=2, help="random prompts compared")
    ap.add_argument("--prompt-len", type=int, default=16, help="tokens per random prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens generated and compared")
    ap.add_argument("--rtol", type=float, default=1e-4, help="allowed max |logit difference| / max |reference logit|")
    ap.add_argument("--page-size", type=int, default=4, help="KV page size of jaxspec's paged cache")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the page shuffle")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        res = check_model(args.path, batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                          rtol=args.rtol, page_size=args.page_size, seed=args.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"check_model: {e}", file=sys.stderr)
        return 2
    print(f"logits: max |jax - hf| = {res.max_abs_diff:.3g}, scale {res.logit_scale:.3g}, "
          f"ratio {res.max_abs_diff / max(res.logit_scale, 1e-30):.3g} (rtol {res.rtol:g}): "
          f"{'ok' if res.logits_ok else 'MISMATCH'}")
    same = (res.greedy_jax == res.greedy_hf).all(axis=1)
    print(f"greedy {res.greedy_hf.shape[1]} tokens x {len(same)} prompts: "
          f"{'identical' if res.greedy_ok else 'DIFFER for prompts ' + str(np.flatnonzero(~same).tolist())}")
    print("match" if res.ok else "MISMATCH")
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())

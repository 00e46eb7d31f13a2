"""Batch invariance on this device: whether a row's logits depend on the rows that share its forward, in the
default mode and in the batch-invariant one, and what the mode costs.

``python bench/invariance.py [--checks] [--timing] [--matmul] [--json PATH]`` (all three when none is named).

* ``--checks``: a random bf16 target of SmolLM2-135M's widths (``--layers`` layers, default 4: the property is
  per layer), page size 16. Four comparisons, each counting logit rows that are BITWISE equal and rows whose
  argmax agrees, per mode:
  ``extend``: N tokens decoded one forward each vs the same tokens in one causal forward (batch 8);
  ``tree``: every node of a random 16-node tree verify forward (positions = prefix + depth, the ancestors'
  mask) vs the causal forward of that node's path;
  ``batch``: request 5 of a batch of 32 (random neighbours and lengths) vs the same request alone, prefill's
  last row and the next decode step;
  ``chunks``: a prompt prefilled whole vs in two chunks, then one decode step.
* ``--timing``: SmolLM2-135M's shape (30 layers, random bf16 weights, one MTP layer drafting), context
  ``--context``: decode tok/s of plain, chain (3,1,4) and tree (5,4,16) (speculative rows with SIMULATED
  acceptance, mean 3.0, so the round's work is fixed) at ``--batches``, default mode vs batch-invariant, the
  ratio of the two in one run; a row is the median of ``--repeats`` loops after the compiling one.
* ``--prefill``: prompts of ``--prompt / 8`` to ``--prompt`` tokens (random lengths, as MT-Bench's) at
  ``--batches``, an engine of ``--layers`` layers (SmolLM2's widths, random bf16 weights), default mode vs
  batch-invariant: prefill time (prompt tokens/s), then ``--max-new`` decode steps from there (ms per step);
  then the invariant kernels alone at the prefill's shapes (``B * prompt`` rows through the projections,
  ``invariant_attention`` over ``[B, prompt]`` causal queries) against the default ones (us per call).
* ``--attention-tiles S/R``: a probe of ``invariant_attention``'s two constants, the key positions per split
  (``KEY_SPLIT``, a multiple of ``KEY_BLOCK``) and the query tile's rows (``TILE_ROWS``, at least 16), set for
  the whole run. Any fixed pair keeps the mode invariant (``--checks`` counts it); the pair changes the
  kernel's speed and its rounding. ``--modes``: the modes the checks and the timing run (default both).
* ``--matmul``: ``invariant_matmul`` against the default product (``jnp.dot``, what ``Linear`` runs) at
  SmolLM2's projection shapes and M = 1, 4, 32, 128, 512 rows, in device loops (us per call).
"""

import dataclasses
import functools
import json
import statistics
import sys
import time

import _cli
from _e2e_parts import prefilled
from _timing import device_time_us

SPECS = {"chain": (3, 1, 4), "tree16": (5, 4, 16)}


def _parse(argv):
    ap = _cli.parser("invariance.py", __doc__)
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="JAX platform to run on")
    ap.add_argument("--checks", action="store_true", help="the bitwise comparisons")
    ap.add_argument("--timing", action="store_true", help="decode tok/s, default vs batch-invariant")
    ap.add_argument("--matmul", action="store_true", help="invariant_matmul vs jnp.dot")
    ap.add_argument("--prefill", action="store_true", help="prefill tok/s and its kernels, default vs invariant")
    ap.add_argument("--prompt", type=int, default=400, help="tokens per prompt (prefill)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the checks' target")
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes (timing)")
    ap.add_argument("--configs", default="plain,chain,tree16", help="comma list of plain, chain, tree16 (timing)")
    ap.add_argument("--context", type=int, default=512, help="tokens in the KV at the start of the timed loop")
    ap.add_argument("--max-new", type=int, default=64, help="tokens generated per request in a timed loop")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timing: timed loops per row after the compiling one (their median)")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized shapes (the test path)")
    ap.add_argument("--attention-tiles", default=None, help="KEY_SPLIT/TILE_ROWS of invariant_attention (a probe)")
    ap.add_argument("--modes", default="default,invariant", help="comma list of default, invariant (checks, timing)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats: expected an int >= 1, got {args.repeats}")
    return args


def _config(layers: int, tiny: bool):
    from jaxspec.models import DecoderConfig

    if tiny:
        return DecoderConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                             num_nextn_predict_layers=1)
    return DecoderConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                         rope_theta=100000.0, tie_word_embeddings=True, num_nextn_predict_layers=1)


# ------------------------------------------------------------------------------------------------- checks


@functools.cache
def _jitted_forward():
    """``(graphdef, weights, tokens, meta, cache) -> (logits, cache)``, jitted once: the weights are arguments
    (closed over, XLA would constant-fold them), and every ``_Forward`` shares the one compile cache."""
    import jax
    from flax import nnx

    def forward(graphdef, weights, tokens, meta, cache):
        return nnx.merge(graphdef, weights).forward(tokens, meta, cache)[::2]

    return jax.jit(forward, static_argnums=0)


class _Forward:
    """Forwards of one target over one pool, in either mode."""

    def __init__(self, target, batch: int, width: int, page: int):
        import jax.numpy as jnp
        from flax import nnx

        from jaxspec.protocols import make_req_to_token

        self.target, self.page, self.width = target, page, width
        self.graphdef, self.weights = nnx.split(target)
        self.r2t = jnp.asarray(make_req_to_token(batch, width, page, seed=batch))
        self.slots = batch * width + page

    def cache(self):
        return self.target.make_cache(self.r2t, self.slots)

    def run(self, tokens, meta, cache, invariant: bool):
        meta = dataclasses.replace(meta, batch_invariant=invariant)
        return _jitted_forward()(self.graphdef, self.weights, tokens, meta, cache)

    def prefill(self, tokens, lens, prefix, cache, invariant):
        import jax.numpy as jnp

        from jaxspec import pipeline

        meta = pipeline.prefill_metadata(jnp.asarray(lens, jnp.int32), self.r2t, tokens.shape[1], page_size=self.page,
                                         prefix_lens=jnp.asarray(prefix, jnp.int32))
        return self.run(tokens, meta, cache, invariant)

    def decode(self, tokens, seq, cache, invariant):
        import jax.numpy as jnp

        from jaxspec import pipeline

        meta = pipeline.decode_metadata(jnp.asarray(seq, jnp.int32), self.r2t, page_size=self.page)
        return self.run(tokens, meta, cache, invariant)


def _count(a, b):
    import numpy as np

    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    rows = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    same = int(np.sum(np.all(rows[0] == rows[1], axis=1)))
    arg = int(np.sum(rows[0].argmax(-1) == rows[1].argmax(-1)))
    return dict(rows=int(rows[0].shape[0]), bitwise=same, argmax=arg, max_abs=float(np.abs(a - b).max()))


def _random_tree(rng, n: int):
    import numpy as np

    parent = np.full(n, -1)
    for i in range(1, n):
        parent[i] = rng.integers(max(0, i - 6), i)
    depth = np.zeros(n, np.int32)
    for i in range(1, n):
        depth[i] = depth[parent[i]] + 1
    mask = np.zeros((n, n), bool)
    paths = []
    for i in range(n):
        j, path = i, []
        while j >= 0:
            mask[i, j] = True
            path.append(j)
            j = parent[j]
        paths.append(path[::-1])
    return depth, mask, paths


def _modes(args) -> list:
    """The ``batch_invariant`` values ``--modes`` names, in order (default first)."""
    names = [m for m in args.modes.split(",") if m]
    bad = [m for m in names if m not in ("default", "invariant")]
    if bad or not names:
        raise SystemExit(f"--modes: expected some of default, invariant, got {args.modes!r}")
    return [m == "invariant" for m in ("default", "invariant") if m in names]


def _attention_tiles(spec: str) -> None:
    """Set ``invariant_attention``'s ``KEY_SPLIT`` and ``TILE_ROWS`` from ``"S/R"`` before anything is traced."""
    import importlib

    ia = importlib.import_module("jaxspec.kernels.invariant_attention")  # the module (the package exports the function)

    try:
        split, rows = (int(x) for x in spec.split("/"))
    except ValueError:
        raise SystemExit(f"--attention-tiles: expected KEY_SPLIT/TILE_ROWS, got {spec!r}") from None
    if split < ia.KEY_BLOCK or split % ia.KEY_BLOCK or rows < 16 or rows & (rows - 1):
        raise SystemExit(f"--attention-tiles: KEY_SPLIT a multiple of {ia.KEY_BLOCK}, TILE_ROWS a power of two >= 16; "
                         f"got {spec!r}")
    ia.KEY_SPLIT, ia.TILE_ROWS = split, rows


def checks(args, save) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxspec.models import Decoder
    from jaxspec.protocols import AttentionMetadata, page_table_from_req_to_token

    cfg = _config(args.layers, args.tiny)
    target = Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    v, page, width = cfg.vocab_size, 16, 256
    rng = np.random.default_rng(0)
    out = {}
    for inv in _modes(args):
        mode = "invariant" if inv else "default"
        res = out[mode] = {}
        # extend: one forward per token vs one causal forward, batch 8
        b, p, n = 8, 37, 6
        fw = _Forward(target, b, width, page)
        prompts = jnp.asarray(rng.integers(0, v, (b, p)), jnp.int32)
        toks = jnp.asarray(rng.integers(0, v, (b, n)), jnp.int32)
        _, c0 = fw.prefill(prompts, [p] * b, [0] * b, fw.cache(), inv)
        c, rows = c0, []
        for j in range(n):
            lg, c = fw.decode(toks[:, j:j + 1], [p + j] * b, c, inv)
            rows.append(lg[:, 0])
        ext, _ = fw.prefill(toks, [n] * b, [p] * b, c0, inv)
        res["extend"] = _count(jnp.stack(rows, 1), ext)
        # tree: 16 nodes vs each node's path as a causal forward
        nt = 16
        depth, mask, paths = _random_tree(rng, nt)
        ttoks = jnp.asarray(rng.integers(0, v, (b, nt)), jnp.int32)
        meta = AttentionMetadata(
            positions=jnp.asarray(p + depth[None].repeat(b, 0), jnp.int32), qmask=jnp.asarray(mask[None].repeat(b, 0)),
            prefix_lens=jnp.full((b,), p, jnp.int32), page_table=page_table_from_req_to_token(fw.r2t, page),
            write_locs=fw.r2t[:, p:p + nt], page_size=page)
        tree, _ = fw.run(ttoks, meta, c0, inv)
        path_rows = []
        for i in range(nt):
            lg, _ = fw.prefill(ttoks[:, paths[i]], [len(paths[i])] * b, [p] * b, c0, inv)
            path_rows.append(lg[:, -1])
        res["tree"] = _count(tree, jnp.stack(path_rows, 1))
        # batch: request 5 of 32 vs alone
        big, me = 32, 5
        lens = rng.integers(8, 120, big)
        lp = int(lens.max())
        batch_prompts = np.asarray(rng.integers(0, v, (big, lp)), np.int32)
        fb, f1 = _Forward(target, big, width, page), _Forward(target, 1, width, page)
        lg_b, cb = fb.prefill(jnp.asarray(batch_prompts), lens, [0] * big, fb.cache(), inv)
        alone = jnp.asarray(batch_prompts[me:me + 1, :lens[me]])
        lg_1, c1 = f1.prefill(alone, [lens[me]], [0], f1.cache(), inv)
        nxt = jnp.asarray(rng.integers(0, v, (big, 1)), jnp.int32)
        d_b, _ = fb.decode(nxt, lens, cb, inv)
        d_1, _ = f1.decode(nxt[me:me + 1], [lens[me]], c1, inv)
        res["batch"] = _count(jnp.stack([lg_b[me, lens[me] - 1], d_b[me, 0]]), jnp.stack([lg_1[0, -1], d_1[0, 0]]))
        # chunks: whole prompt vs two chunks, then one decode step
        whole, cw = f1.prefill(alone, [lens[me]], [0], f1.cache(), inv)
        cut = int(lens[me]) // 2
        _, cc = f1.prefill(alone[:, :cut], [cut], [0], f1.cache(), inv)
        part, cc = f1.prefill(alone[:, cut:], [int(lens[me]) - cut], [cut], cc, inv)
        dw, _ = f1.decode(nxt[me:me + 1], [lens[me]], cw, inv)
        dc, _ = f1.decode(nxt[me:me + 1], [lens[me]], cc, inv)
        res["chunks"] = _count(jnp.stack([whole[0, -1], dw[0, 0]]), jnp.stack([part[0, -1], dc[0, 0]]))
        jax.clear_caches()
        save(out)
        print(mode, json.dumps(res), flush=True)
    return out


# ------------------------------------------------------------------------------------------------- timing


def timing(args, save) -> list:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec.config import SpecConfig
    from jaxspec.engine import Engine, SimulatedAccept
    from jaxspec.models import MTPDrafter, MTPModel


    cfg = _config(2 if args.tiny else 30, args.tiny)
    model = MTPModel(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16, num_mtp_layers=1,
                     num_draft_steps=5)
    width = -(-(args.context + args.max_new + 32) // 16) * 16
    rows = []
    for batch in [int(x) for x in args.batches.split(",")]:
        for name in args.configs.split(","):
            row = dict(config=name, batch=batch)
            for inv in _modes(args):
                kw = dict(max_context=width, page_size=16, max_batch=batch, batch_invariant=inv)
                if name == "plain":
                    eng = Engine(model, None, **kw)
                else:
                    eng = Engine(model, MTPDrafter(model), spec=SpecConfig(*SPECS[name]),
                                 simulate_accept=SimulatedAccept(mean=3.0), **kw)
                times, t_first = [], None
                for rep in range(1 + args.repeats):
                    state = prefilled(eng, batch, args.context, args.max_new)
                    t0 = time.perf_counter()
                    state = jax.block_until_ready(eng.run_decode(state))
                    dt = time.perf_counter() - t0
                    if rep == 0:
                        t_first = dt
                    else:
                        times.append(dt)
                toks = int(state.num_generated.sum()) - batch  # the prefill's token is not the loop's
                med = statistics.median(times)
                key = "invariant" if inv else "default"
                row[f"{key}_tok_s"] = toks / med
                row[f"{key}_compile_s"] = t_first - med
                del eng, state
                jax.clear_caches()
            if "invariant_tok_s" in row and "default_tok_s" in row:
                row["ratio"] = row["invariant_tok_s"] / row["default_tok_s"]
            print(json.dumps(row), flush=True)
            rows.append(row)
            save(rows)
    return rows


# ------------------------------------------------------------------------------------------------- matmul


def matmul(args, save) -> list:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxspec.kernels import invariant_matmul


    cfg = _config(1, args.tiny)
    d, f, e = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * e
    shapes = {"qkv": (d, qkv, False), "o": (cfg.num_attention_heads * e, d, False), "gate_up": (d, 2 * f, False),
              "down": (f, d, False), "lm_head": (d, cfg.vocab_size, True)}
    rng = np.random.default_rng(0)
    rows = []
    for name, (k, n, tw) in shapes.items():
        w = jnp.asarray(rng.standard_normal((n, k) if tw else (k, n)) * k**-0.5, jnp.bfloat16)
        for m in (1, 4, 32, 128, 512):
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
            dims = (((1,), (1,)), ((), ())) if tw else (((1,), (0,)), ((), ()))

            def default(c, w=w, dims=dims):
                y = jax.lax.dot_general(c.astype(w.dtype), w, dims, preferred_element_type=jnp.float32)
                return c + 1e-30 * y[:, :1]

            def inv(c, w=w, tw=tw):
                return c + 1e-30 * invariant_matmul(c, w, transpose_w=tw)[:, :1]

            t_def, _ = device_time_us(default, x + 0, reps=50, trials=3)  # the loop donates its state
            t_inv, _ = device_time_us(inv, x + 0, reps=50, trials=3)
            row = dict(weight=name, k=k, n=n, m=m, default_us=t_def, invariant_us=t_inv, ratio=t_inv / max(t_def, 1e-9))
            print(json.dumps(row), flush=True)
            rows.append(row)
            save(rows)
    return rows


# ------------------------------------------------------------------------------------------------- prefill


def prefill(args, save) -> list:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jaxspec.engine import Engine
    from jaxspec.kernels import invariant_attention, invariant_matmul, paged_attention
    from jaxspec.models import Decoder

    cfg = _config(args.layers, args.tiny)
    model = Decoder(cfg, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16)
    rng = np.random.default_rng(0)
    page = 16
    width = -(-(args.prompt + args.max_new + 32) // page) * page
    rows = []
    for batch in [int(x) for x in args.batches.split(",")]:
        lens = rng.integers(max(1, args.prompt // 8), args.prompt + 1, batch)  # MT-Bench-like spread
        lens[0] = args.prompt
        prompts = [rng.integers(0, cfg.vocab_size, n).astype(np.int32) for n in lens]
        row = dict(part="engine", batch=batch, prompt=args.prompt, layers=args.layers, prompt_tokens=int(lens.sum()))
        for inv in (False, True):
            eng = Engine(model, None, max_context=width, page_size=page, max_batch=batch, batch_invariant=inv)
            pre, dec = [], []
            for _ in range(3):
                t0 = time.perf_counter()
                state = jax.block_until_ready(eng.run_prefill(*eng.prepare(prompts, args.max_new)))
                t1 = time.perf_counter()
                state = jax.block_until_ready(eng.run_decode(state))
                pre.append(t1 - t0)
                dec.append(time.perf_counter() - t1)
            key = "invariant" if inv else "default"
            row[f"{key}_prefill_ms"] = statistics.median(pre[1:]) * 1e3
            row[f"{key}_tok_s"] = int(lens.sum()) / statistics.median(pre[1:])  # prompt tokens per second
            row[f"{key}_decode_ms_per_step"] = statistics.median(dec[1:]) * 1e3 / args.max_new
            del eng, state
            jax.clear_caches()
        row["ratio"] = row["invariant_tok_s"] / row["default_tok_s"]
        row["decode_ratio"] = row["default_decode_ms_per_step"] / row["invariant_decode_ms_per_step"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        save(rows)
        # the kernels alone at this prefill's shapes
        m, d, e = batch * args.prompt, cfg.hidden_size, cfg.head_dim
        hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        for name, (k, n) in {"qkv": (d, (hq + 2 * hkv) * e), "gate_up": (d, 2 * cfg.intermediate_size),
                             "down": (cfg.intermediate_size, d)}.items():
            w = jnp.asarray(rng.standard_normal((k, n)) * k**-0.5, jnp.bfloat16)
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)

            def dflt(c, w=w):
                return c + 1e-30 * jnp.dot(c.astype(w.dtype), w, preferred_element_type=jnp.float32)[:, :1]

            def invm(c, w=w):
                return c + 1e-30 * invariant_matmul(c, w)[:, :1]

            t_def, _ = device_time_us(dflt, x + 0, reps=10, trials=3)
            t_inv, _ = device_time_us(invm, x + 0, reps=10, trials=3)
            r = dict(part="matmul", weight=name, m=m, k=k, n=n, default_us=t_def, invariant_us=t_inv,
                     ratio=t_inv / max(t_def, 1e-9))
            print(json.dumps(r), flush=True)
            rows.append(r)
        pages = width // page
        table = jnp.arange(batch * pages, dtype=jnp.int32).reshape(batch, pages)
        q = jnp.asarray(rng.standard_normal((batch, args.prompt, hq, e)), jnp.bfloat16)
        kv = jnp.asarray(rng.standard_normal((batch, args.prompt, hkv, e)), jnp.bfloat16)
        pool = jnp.zeros((batch * width, hkv, e), jnp.bfloat16)
        zero = jnp.zeros((batch,), jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(args.prompt, dtype=jnp.int32), (batch, args.prompt))
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((args.prompt, args.prompt), bool)), (batch, args.prompt,
                                                                                          args.prompt))
        locs = (table[:, :, None] * page + jnp.arange(page, dtype=jnp.int32)).reshape(batch, -1)[:, :args.prompt]

        def dflt_att(c):
            out = paged_attention(c, kv, kv, pool, pool, table, zero, causal, page_size=page, sm_scale=e**-0.5)
            return c + (1e-30 * out).astype(c.dtype)

        def inv_att(c):
            out, _, _ = invariant_attention(c, kv, kv, pool, pool, table, zero, pos, causal, locs, page_size=page,
                                            sm_scale=e**-0.5)
            return c + (1e-30 * out).astype(c.dtype)

        t_def, _ = device_time_us(dflt_att, q + 0, reps=10, trials=3)
        t_inv, _ = device_time_us(inv_att, q + 0, reps=10, trials=3)
        r = dict(part="attention", batch=batch, prompt=args.prompt, default_us=t_def, invariant_us=t_inv,
                 ratio=t_inv / max(t_def, 1e-9))
        print(json.dumps(r), flush=True)
        rows.append(r)
        save(rows)
    return rows


def main(argv=None):
    args = _cli.parse_on_device(_parse, argv)
    import jax

    todo = [n for n in ("checks", "timing", "matmul", "prefill") if getattr(args, n)] or ["checks", "timing",
                                                                                           "matmul"]
    if args.attention_tiles:
        _attention_tiles(args.attention_tiles)
    out = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__, args=vars(args))

    def save(name, value):  # after every part and row: a run cut short keeps what it measured
        out[name] = value
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)

    parts = dict(checks=checks, timing=timing, matmul=matmul, prefill=prefill)
    for name in todo:
        save(name, parts[name](args, lambda v, n=name: save(n, v)))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

"""A real model on MT-Bench: jaxspec plain and speculative decoding (trained EAGLE-3 / MTP heads) against
transformers' greedy ``generate`` on the same prompts, in one run.

``python bench/real_model.py --model SmolLM2-135M-Instruct.Q4_1.gguf --questions question.jsonl
[--eagle3 DIR] [--mtp DIR] [--parts plain,spec,hf] [--json PATH] [--png PATH]``

Prompts: MT-Bench's 80 first turns (``--questions``: the ``question.jsonl`` that ``python -m jaxspec.data.mtbench``
fetches), each rendered through the checkpoint's own chat template (``jaxspec.text``) and tokenized once; every
engine decodes the same token ids. Parts (``--parts``, in this order; each row is written to ``--json`` as soon as
it is measured, so a run cut short keeps what it measured):

* ``plain``: jaxspec plain decoding against transformers on equal work: every request generates exactly
  ``--fixed-tokens`` tokens (no stop token), batches ``--batches`` (the first ``b`` prompts).
* ``spec``: plain and speculative decoding with the trained heads, stopping at the chat template's end-of-turn
  token (``<|im_end|>``), at most ``--new-tokens``. Per engine (drafter x config, ``--configs``): the mean accept
  length (tokens per verify round) over all 80 prompts in one batch at temperature 0 (and ``--temperatures``),
  the per-request accept lengths' histogram, whether its greedy tokens equal plain decoding's (every config's,
  first), then tokens/s at ``--batches`` (generated tokens / seconds). Lossless: at temperature 0 every engine
  returns plain decoding's tokens (up to bf16 near-ties between a 1-row and a multi-row forward; none in the
  batch-invariant mode). Adaptive configs' rows also carry ``mode_rounds`` (the batch's rounds per mode),
  ``round_costs_ms`` (the calibrated prices per batch bucket) and ``policy_learned`` (per bucket, the running
  accept lengths, request-rounds, idle rounds and probe back-offs the call left), and each timed batch adds the
  engine forced to each mode (``forced_mode`` rows).
  ``--modes default,invariant`` runs the part once per mode (``Engine(batch_invariant=True)``), side by side; the
  invariant mode also decodes the first 32 requests alone and all of them through the serving core, each
  compared with its reply in the all-prompts batch.
* ``hf``: transformers (the same GGUF via ``from_pretrained(dir, gguf_file=...)``, bf16, CUDA), equal work as in
  ``plain``: ``generate(do_sample=False)`` per path of ``--hf``, run in the order ``eager`` (dynamic cache),
  ``pld`` (prompt-lookup decoding, ``prompt_lookup_num_tokens=10``, batch 1) and ``compile`` (its documented
  static-cache path: ``generate(cache_implementation="static", compile_config=CompileConfig())``, which compiles
  the decode step itself under ``torch.compile(mode="reduce-overhead")``; one warm-up call per prompt group), each
  from the model as loaded; a path that fails gives a row with ``error`` and the others still run. Batches
  left-padded.

jaxspec: ``load_model(--model, param_dtype=bf16, kv_dtype=bf16)``; each ``generate`` is one XLA ``while_loop``
(prefill included in the time); per engine and batch size the first call compiles, then the median of
``--repeats`` calls. ``--budget-s``: stop starting new rows after this many seconds (rows are ordered by priority).
"""

import json
import os
import statistics
import sys
import time

import _cli
from _rows import Run

CONFIGS = {  # name -> (drafter, spec list, adaptive)
    "eagle3-chain3": ("eagle3", [(3, 1, 4)], False),
    "eagle3-chain7": ("eagle3", [(7, 1, 8)], False),
    "eagle3-tree": ("eagle3", [(5, 4, 16)], False),
    "mtp-chain3": ("mtp", [(3, 1, 4)], False),
    "eagle3-adaptive": ("eagle3", [(3, 1, 4), (7, 1, 8)], True),
    "eagle3-adaptive-tree": ("eagle3", [(3, 1, 4), (5, 4, 16)], True),
    "mtp-tree": ("mtp", [(3, 2, 6)], False),
}


def _parse(argv):
    ap = _cli.parser("real_model.py", __doc__)
    ap.add_argument("--model", required=True, help="a .gguf file or a Hugging Face checkpoint directory")
    ap.add_argument("--questions", required=True, help="MT-Bench question.jsonl (first turns are the prompts)")
    ap.add_argument("--eagle3", default=None, help="EAGLE-3 head directory (jaxspec.models.load_eagle3)")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="keep the EAGLE-3 head's N most frequent draft tokens (load_eagle3's draft_vocab; "
                         "default: all)")
    ap.add_argument("--mtp", default=None, help="MTP head directory (jaxspec.models.load_mtp_head)")
    ap.add_argument("--parts", default="plain,spec,hf", help="comma list of parts: plain, spec, hf")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {sorted(CONFIGS)}")
    ap.add_argument("--batches", default="1,8,32", help="comma list of batch sizes for tokens/s")
    ap.add_argument("--new-tokens", type=int, default=256, help="spec part: most tokens per request")
    ap.add_argument("--fixed-tokens", type=int, default=256, help="plain/hf parts: tokens per request")
    ap.add_argument("--temperatures", default="0,0.7", help="spec part: acceptance temperatures")
    ap.add_argument("--serving-slots", type=int, default=16,
                    help="spec part, invariant mode: the serving core's slots in its check against the batch")
    ap.add_argument("--modes", default="default",
                    help="spec part: comma list of default, invariant (Engine(batch_invariant=True)), run in order")
    ap.add_argument("--accept-configs", default="eagle3-chain3,mtp-chain3",
                    help="configs whose acceptance is also measured at the non-zero temperatures")
    ap.add_argument("--accept-batch", type=int, default=None,
                    help="spec part: acceptance over all prompts in batches of this many (default: one batch)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per row (median)")
    ap.add_argument("--hf", default="eager,pld,compile",
                    help="hf part: comma list of eager, pld, compile (run in that order)")
    ap.add_argument("--hf-prompts-b1", type=int, default=2, help="hf part: prompts timed one by one at batch 1")
    ap.add_argument("--page-size", type=int, default=16, help="jaxspec's KV page size")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="gpu", help="JAX platform")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="jaxspec weights and KV")
    ap.add_argument("--budget-s", type=float, default=None, help="start no new row after this many seconds")
    ap.add_argument("--json", default=None, help="write the rows here (after every row)")
    ap.add_argument("--png", default=None, help="plot: speed-up over plain per config and batch, accept histogram")
    return ap.parse_args(argv)


def prompt_ids(model_path: str, questions_path: str):
    """``(tokenizer, ids)``: MT-Bench first turns through the checkpoint's chat template, as token ids."""
    from jaxspec.text import Tokenizer

    tok = Tokenizer.from_file(model_path)
    with open(questions_path) as f:
        questions = [json.loads(line) for line in f if line.strip()]
    return tok, [tok.encode_chat([{"role": "user", "content": q["turns"][0]}]) for q in questions]


def _timed(fn, repeats):
    """``(result, first_s, seconds)``: one untimed first call (compiles; adaptive engines also calibrate), then the
    median of ``repeats`` timed calls; ``result`` is the last timed call's (an adaptive engine's later calls start
    from what the earlier ones learned, so their rounds per mode are not the first call's)."""
    t0 = time.perf_counter()
    out = fn()
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, first_s, statistics.median(times)


class _All:
    """The results of ``generate`` over all prompts in chunks of ``chunk`` requests, as one ``GenerateResult``."""

    def __init__(self, eng, prompts, new_tokens, chunk, **kw):
        import numpy as np

        parts = [eng.generate(prompts[i:i + chunk], new_tokens, **kw) for i in range(0, len(prompts), chunk)]
        self.tokens = [t for r in parts for t in r.tokens]
        self.num_rounds = np.concatenate([r.num_rounds for r in parts])
        self.num_accepted = np.concatenate([r.num_accepted for r in parts])
        modes = [r.mode_rounds for r in parts if r.mode_rounds is not None]
        self.mode_rounds = np.sum(modes, axis=0) if modes else None
        self.mean_accept_length = float(self.num_accepted.sum()) / max(1, int(self.num_rounds.sum()))


def _n_tokens(res) -> int:
    return int(sum(len(t) for t in res.tokens))


# ------------------------------------------------------------------------------------------------ jaxspec
class Models:
    """The target loaded once per feature layout (plain / MTP share one; EAGLE-3 taps aux layers)."""

    def __init__(self, args):
        import jax.numpy as jnp

        self.args, self.dtype = args, getattr(jnp, args.dtype)
        self._plain = self._e3 = None

    def plain(self):
        from jaxspec.models import load_model

        if self._plain is None:
            self._plain = load_model(self.args.model, param_dtype=self.dtype, kv_dtype=self.dtype)
        return self._plain

    def drafter(self, kind: str, max_steps: int):
        from jaxspec.models import load_target_with_head

        head = {"eagle3": self.args.eagle3, "mtp": self.args.mtp}[kind]
        if head is None:
            return None
        kw = dict(param_dtype=self.dtype, kv_dtype=self.dtype)
        if kind == "mtp":  # attached to the plain target (its weights shared)
            return tuple(load_target_with_head(self.args.model, head, kind=kind, num_draft_steps=max_steps,
                                               target=self.plain(), **kw)[:2])
        if self._e3 is None:
            self._e3 = tuple(load_target_with_head(self.args.model, head, kind=kind, head_param_dtype=self.dtype,
                                                   head_kv_dtype=self.dtype, draft_vocab=self.args.draft_vocab,
                                                   **kw)[:2])
        return self._e3


def part_plain(run, models, prompts, batches, args, eos_id=None, tokens=None, label="plain"):
    """Plain decoding rows (``tokens`` per request; ``eos_id`` None: exactly that many)."""
    from jaxspec.engine import Engine

    tokens = tokens or args.fixed_tokens
    # the spec part's plain engine has the same shapes (context, pool), so the two share executables
    w = _context(prompts, tokens, 16, args.page_size)
    eng = Engine(models.plain(), max_context=w, page_size=args.page_size,
                 max_batch=max([args.accept_batch or len(prompts)] + batches), eos_id=eos_id)
    out = {}
    for b in batches:
        if not run.time_left():
            break
        res, first_s, s = _timed(lambda: eng.generate(prompts[:b], tokens), args.repeats)
        n = _n_tokens(res)
        out[b] = run.add(part=label, engine="jaxspec", path="plain", batch=b, tokens=n, seconds=s, tok_s=n / s,
                         ms_per_step=1e3 * s / max(len(t) for t in res.tokens), first_call_s=first_s)
        print(f"jaxspec {label:<6s} b={b:<3d} {n / s:10.1f} tok/s  (first call {first_s:.1f} s)", flush=True)
    return out


def _context(prompts, new_tokens, width, page):
    need = max(len(p) for p in prompts) + new_tokens + width + 1
    return -(-need // page) * page


def part_spec(run, models, prompts, batches, args, eos_id, mode="default"):
    import numpy as np

    from jaxspec.config import SpecConfig
    from jaxspec.engine import Engine

    n_all = len(prompts)
    chunk = args.accept_batch or n_all
    most = max([chunk] + batches)
    temps = [float(t) for t in args.temperatures.split(",") if t]
    plain_tok = {}
    # plain reference: all prompts at temperature 0 (the lossless check), and tokens/s at --batches
    w = _context(prompts, args.new_tokens, 16, args.page_size)
    inv = mode == "invariant"
    plain = Engine(models.plain(), max_context=w, page_size=args.page_size, max_batch=most, eos_id=eos_id,
                   batch_invariant=inv)
    t0 = time.perf_counter()
    ref = _All(plain, prompts, args.new_tokens, chunk)
    plain_all_s = time.perf_counter() - t0
    run.add(part="spec", mode=mode, engine="jaxspec", config="plain", batch=n_all, accept_len=1.0,
            tokens=_n_tokens(ref), first_call_s=plain_all_s)
    ref_tokens = [np.asarray(t).tolist() for t in ref.tokens]
    if inv and run.time_left():
        _invariance_rows(run, plain, prompts, ref_tokens, args, eos_id)
    engines = {}  # every config's acceptance and equality first (the checks), then every config's tokens/s
    for name in args.configs.split(","):
        if not run.time_left():
            return
        kind, shapes, adaptive = CONFIGS[name]
        specs = [SpecConfig(*x) for x in shapes]
        pair = models.drafter(kind, max(s.num_steps for s in specs))
        if pair is None:
            print(f"{name}: no --{kind} head given, skipped", flush=True)
            continue
        target, drafter = pair
        width = max(s.num_draft_tokens for s in specs)
        w = _context(prompts, args.new_tokens, width, args.page_size)
        eng = Engine(target, drafter, spec=specs if adaptive else specs[0], adaptive=True if adaptive else None,
                     max_context=w, page_size=args.page_size, max_batch=most, eos_id=eos_id, batch_invariant=inv)
        engines[name] = eng
        for t in [0.0] + ([x for x in temps if x > 0] if name in args.accept_configs.split(",") else []):
            if not run.time_left():
                return
            t0 = time.perf_counter()
            res = _All(eng, prompts, args.new_tokens, chunk, temperature=t, seed=0)
            first_s = time.perf_counter() - t0
            per_req = (res.num_accepted / np.maximum(res.num_rounds, 1)).tolist()
            row = dict(part="spec", mode=mode, engine="jaxspec", config=name, specs=shapes, temperature=t, batch=n_all,
                       accept_len=res.mean_accept_length, accept_per_request=per_req, tokens=_n_tokens(res),
                       first_call_s=first_s)
            if res.mode_rounds is not None:
                row["mode_rounds"] = np.asarray(res.mode_rounds).tolist()
                row["round_costs_ms"] = _round_costs_ms(eng)
                row["policy_learned"] = _policy_learned(eng)
            if t == 0.0:
                got = [np.asarray(x).tolist() for x in res.tokens]
                same = [a == b for a, b in zip(got, ref_tokens)]
                row["same_as_plain"] = int(sum(same))
                row["first_difference"] = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                                min(len(a), len(b))) for a, b, ok in zip(got, ref_tokens, same)
                                           if not ok]
            run.add(**row)
            extra = f", {row['same_as_plain']}/{n_all} equal to plain" if t == 0.0 else ""
            print(f"{name:<18s} T={t:<4g} accept {res.mean_accept_length:.3f}{extra} ({mode})", flush=True)
    for b in batches:
        if not run.time_left():
            return
        res, first_s, s = _timed(lambda: plain.generate(prompts[:b], args.new_tokens), args.repeats)
        plain_tok[b] = _n_tokens(res) / s
        run.add(part="spec", mode=mode, engine="jaxspec", config="plain", batch=b, tokens=_n_tokens(res), seconds=s,
                tok_s=plain_tok[b], first_call_s=first_s)
        print(f"spec plain          b={b:<3d} {plain_tok[b]:10.1f} tok/s ({mode})", flush=True)
    for name, eng in engines.items():
        for b in batches:
            if not run.time_left():
                return
            res, first_s, s = _timed(lambda: eng.generate(prompts[:b], args.new_tokens), args.repeats)
            tok_s = _n_tokens(res) / s
            extra = {} if res.mode_rounds is None else dict(mode_rounds=np.asarray(res.mode_rounds).tolist(),
                                                            round_costs_ms=_round_costs_ms(eng),
                                                            policy_learned=_policy_learned(eng))
            run.add(part="spec", mode=mode, engine="jaxspec", config=name, batch=b, tokens=_n_tokens(res), seconds=s,
                    tok_s=tok_s,
                    accept_len=res.mean_accept_length, first_call_s=first_s,
                    speedup=tok_s / plain_tok[b] if b in plain_tok else None, **extra)
            print(f"{name:<18s} b={b:<3d} {tok_s:10.1f} tok/s  {tok_s / plain_tok.get(b, float('nan')):.2f}x plain "
                  f"(accept {res.mean_accept_length:.2f}; first call {first_s:.1f} s; {mode})", flush=True)
            if res.mode_rounds is not None:
                _forced_rows(run, eng, name, prompts[:b], args, plain_tok.get(b), mode)


def _forced_rows(run, eng, name, prompts, args, plain_tok_s, mode):
    """An adaptive engine with every round forced to one mode (``Engine.run_decode(mode=)``: the same executable
    as the policy's loop) on the same prompts: what each mode costs inside the adaptive loop, beside the fixed
    engines' rows and the policy's own (a policy that picks plain should cost what this plain row costs)."""
    import numpy as np

    for m in range(1 + len(eng.opts.specs)):
        if not run.time_left():
            return

        def call():
            st = eng.run_decode(eng.run_prefill(*eng.prepare(prompts, args.new_tokens)), mode=m)
            return eng.result(st, len(prompts))

        res, _, s = _timed(call, args.repeats)
        tok_s = _n_tokens(res) / s
        run.add(part="spec", mode=mode, engine="jaxspec", config=name, forced_mode=m, batch=len(prompts),
                tokens=_n_tokens(res), seconds=s, tok_s=tok_s, accept_len=res.mean_accept_length,
                rounds=int(np.max(res.num_rounds)), speedup=tok_s / plain_tok_s if plain_tok_s else None)
        print(f"{name:<18s} b={len(prompts):<3d} forced mode {m}: {tok_s:10.1f} tok/s "
              f"{tok_s / (plain_tok_s or float('nan')):.2f}x plain (accept {res.mean_accept_length:.2f})", flush=True)


def _policy_learned(eng) -> dict:
    """An adaptive engine's policy as its last call at each batch bucket left it (``Engine.policy_memory``, the next
    call's warm start): per mode the running accept length, its request-rounds, the idle rounds and the probe
    back-off: what the choices of the row were made from."""
    import numpy as np

    return {int(b): {k: np.asarray(getattr(ps, k)).tolist() for k in ("accept", "seen", "idle", "backoff")}
            for b, ps in eng.policy_memory.items()}


def _round_costs_ms(eng) -> dict:
    """An adaptive engine's calibrated seconds per round of each mode (plain, then each shape), per batch bucket,
    in ms: what its choices were made from."""
    import numpy as np

    return {int(b): (np.asarray(c) * 1e3).tolist() for b, c in eng.round_costs.items()}


def _invariance_rows(run, plain, prompts, ref_tokens, args, eos_id):
    """The batch-invariant mode's own checks on the real prompts: the first 32 requests decoded alone (batch 1)
    against their replies in the all-prompts batch, and the serving core (``--serving-slots`` slots, every request
    submitted at once, so they join and leave a running batch) against the same replies."""
    import numpy as np

    from jaxspec.engine import Engine
    from jaxspec.serving import RequestParams, ServingEngine

    n = min(32, len(prompts))
    solo = Engine(plain.target, None, max_context=plain.max_context, page_size=args.page_size, max_batch=1,
                  eos_id=eos_id, batch_invariant=True)
    same = [np.asarray(solo.generate([prompts[i]], args.new_tokens).tokens[0]).tolist() == ref_tokens[i]
            for i in range(n)]
    run.add(part="spec", mode="invariant", check="alone_vs_batch", requests=n, same=int(sum(same)))
    print(f"invariant: {sum(same)}/{n} requests alone equal to the same requests in the batch of {len(prompts)}",
          flush=True)
    eng = Engine(plain.target, None, max_context=plain.max_context, page_size=args.page_size,
                 max_batch=args.serving_slots, eos_id=eos_id, batch_invariant=True)
    se = ServingEngine(eng, rounds_per_step=4)
    handles = [se.submit(np.asarray(p, np.int32), RequestParams(max_new_tokens=args.new_tokens)) for p in prompts]
    while se.has_unfinished():
        se.step()
    same = [[int(x) for x in h.output] == ref for h, ref in zip(handles, ref_tokens)]
    run.add(part="spec", mode="invariant", check="serving_vs_batch", requests=len(prompts), same=int(sum(same)),
            slots=args.serving_slots)
    print(f"invariant: serving core ({args.serving_slots} slots) {sum(same)}/{len(prompts)} equal to the batch",
          flush=True)


# ------------------------------------------------------------------------------------------------ transformers
# the hf part's paths in the order they run: compile last, as a failed CUDA graph can leave the device unusable for
# whatever runs after it
HF_PATHS = ("eager", "pld", "compile")


def hf_paths(spec: str) -> list:
    """The paths of ``--hf`` (a comma list) in the order they run (``HF_PATHS``), unknown names refused."""
    got = [p for p in spec.split(",") if p]
    bad = [p for p in got if p not in HF_PATHS]
    if bad:
        raise SystemExit(f"--hf: unknown {bad}; expected some of {list(HF_PATHS)}")
    return [p for p in HF_PATHS if p in got]


# what a path can leave on the model: a forward replaced by hand, generate's own compiled forward (and the config it
# was compiled with), the static cache length it keeps to avoid recompiling
_HF_STATE = ("forward", "_compiled_call", "_last_compile_config", "_previous_max_cache_length")


def reset_hf_model(model, generation_config) -> None:
    """``model`` as loaded: what a path may have left on it removed, ``generation_config`` (a copy) restored, and
    torch.compile's caches cleared, so no compiled forward or cache setting passes from one path to the next."""
    import copy

    import torch

    for name in _HF_STATE:
        model.__dict__.pop(name, None)
    model.generation_config = copy.deepcopy(generation_config)
    torch._dynamo.reset()


def _hf_path_kwargs(path: str, device: str) -> dict:
    """``generate`` keywords of one path, passed per call (the model itself is not changed)."""
    if path == "eager":
        return dict(disable_compile=True)
    if path == "pld":
        return dict(disable_compile=True, prompt_lookup_num_tokens=10)
    from transformers import CompileConfig

    config = CompileConfig()  # transformers' defaults: inductor, mode="reduce-overhead" (CUDA graphs)
    if device != "cuda":  # generate compiles by itself on accelerators only; this is its switch for other devices
        config._compile_all_devices = True
    return dict(cache_implementation="static", compile_config=config)


def part_hf(run, prompts, batches, args, ours):
    """transformers' greedy ``generate`` on the prompts, one row per path (``--hf``) and batch size.

    Paths, each from the model as loaded (``reset_hf_model`` before it), in the order ``eager``, ``pld``,
    ``compile``; a path that raises gives a row with ``error`` (and the next ones still run):

    * ``eager``: the default dynamic cache, no compilation.
    * ``pld``: prompt-lookup decoding (``prompt_lookup_num_tokens=10``), batch 1 only.
    * ``compile``: ``generate(cache_implementation="static", compile_config=CompileConfig())``, transformers'
      documented automatic compilation (``CompileConfig``'s docstring: "Automatic compile configuration, used with
      static cache"; ``GenerationConfig.compile_config`` and ``disable_compile``): with a compileable cache
      ``generate`` compiles the one-token decode step itself (``CompileConfig``'s defaults: inductor,
      ``mode="reduce-overhead"``, i.e. CUDA graphs), runs the prefill uncompiled, and copies the logits out of each
      step before the next one replays the graph. The hand-made recipe of the "Optimizing inference" guide,
      ``model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)``, puts the prefill
      (other shapes) under CUDA graphs as well, inside generate's own compile of the same forward, and on an H200
      failed with "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run". One
      warm-up call per prompt group (it compiles and records the graphs) before the timed one; the row's
      ``compiled`` says whether generate did compile.
    """
    import copy

    import torch
    import transformers

    path = os.path.abspath(args.model)
    d, f = os.path.dirname(path), os.path.basename(path)
    kw = dict(gguf_file=f) if f.endswith(".gguf") else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(d if kw else path, dtype=torch.bfloat16, **kw)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(dev).eval()
    loaded_config = copy.deepcopy(model.generation_config)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    pad = 0
    n_new = args.fixed_tokens
    gen = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=pad)

    def inputs(batch):
        n = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (n - len(p)) + p for p in batch], device=dev)
        mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in batch], device=dev)
        return dict(input_ids=ids, attention_mask=mask)

    def call(x, extra, compiled):
        if compiled:  # a new step of CUDA graphs: nothing of the previous call is read again
            torch.compiler.cudagraph_mark_step_begin()
        return model.generate(**x, **gen, **extra)

    def timed(batch, extra, compiled):
        """Seconds and generated tokens of one ``generate`` (after a warm-up call when ``compiled``)."""
        x = inputs(batch)
        if compiled:
            call(x, extra, compiled)
            sync()
        t0 = time.perf_counter()
        out = call(x, extra, compiled)
        sync()
        return time.perf_counter() - t0, (out.shape[1] - x["input_ids"].shape[1]) * len(batch)

    rows = []
    for p in hf_paths(args.hf):
        reset_hf_model(model, loaded_config)
        extra = _hf_path_kwargs(p, dev)
        for b in [1] if p == "pld" else batches:
            if not run.time_left():
                reset_hf_model(model, loaded_config)
                return rows
            groups = [[q] for q in prompts[: args.hf_prompts_b1]] if b == 1 else [prompts[:b]]
            row = dict(part="hf", engine="transformers", path=p, batch=b, prompts=len(groups) * len(groups[0]))
            try:
                s = n = 0
                for g in groups:
                    si, ni = timed(g, extra, compiled=(p == "compile"))
                    s, n = s + si, n + ni
            except Exception as e:  # one path's failure is a row, not the end of the part
                row["error"] = f"{type(e).__name__}: {e}"[:2000]
                rows.append(run.add(**row))
                print(f"transformers {p:<7s} b={b:<3d} failed: {row['error'][:500]}", flush=True)
                continue
            row.update(tokens=n, seconds=s, tok_s=n / s)
            if p == "compile":
                row["compiled"] = hasattr(model, "_compiled_call")
            if b in ours:
                row["jaxspec_plain_over_this"] = ours[b]["tok_s"] / row["tok_s"]
            rows.append(run.add(**row))
            print(f"transformers {p:<7s} b={b:<3d} {n / s:10.1f} tok/s"
                  + (f"  (jaxspec plain {row['jaxspec_plain_over_this']:.1f}x)" if b in ours else ""), flush=True)
    reset_hf_model(model, loaded_config)
    return rows


def plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if r.get("part") == "spec"]
    speed = [r for r in rows if r.get("speedup")]
    acc = [r for r in rows if "accept_per_request" in r and r.get("temperature") == 0.0]
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(dict.fromkeys(r["config"] for r in speed))
    batches = sorted({r["batch"] for r in speed})
    for j, b in enumerate(batches):
        ys = [next((r["speedup"] for r in speed if r["config"] == n and r["batch"] == b), 0) for n in names]
        ax[0].bar([i + 0.8 * j / len(batches) for i in range(len(names))], ys, 0.8 / len(batches), label=f"batch {b}")
    ax[0].axhline(1.0, color="k", lw=0.8)
    ax[0].set_xticks([i + 0.4 - 0.4 / len(batches) for i in range(len(names))], names, rotation=20, fontsize=8)
    ax[0].set_ylabel("tokens/s over jaxspec plain")
    ax[0].legend()
    for r in acc:
        ax[1].hist(r["accept_per_request"], bins=20, histtype="step", label=f"{r['config']} ({r['accept_len']:.2f})")
    ax[1].set_xlabel("accept length per request (MT-Bench first turns, T=0)")
    ax[1].set_ylabel("requests")
    ax[1].legend(fontsize=8)
    _cli.save_figure(fig, path, f"{doc['model']} on {doc['gpu']}")


def main(argv=None) -> int:
    args = _cli.parse_on_device(_parse, argv)
    import jax

    parts = [p for p in args.parts.split(",") if p]
    bad = [p for p in parts if p not in ("plain", "spec", "hf")] + [c for c in args.configs.split(",")
                                                                    if c not in CONFIGS]
    if bad:
        raise SystemExit(f"--parts/--configs: unknown {bad}")
    if "hf" in parts:
        hf_paths(args.hf)  # refuses unknown paths before anything runs
    batches = [int(x) for x in args.batches.split(",") if x]  # none: the spec part measures acceptance only
    tok, prompts = prompt_ids(args.model, args.questions)
    if len(prompts) < max(batches, default=0):
        raise SystemExit(f"--questions: {len(prompts)} prompts, fewer than the largest batch")
    eos = tok.end_of_turn_token_id
    print(f"{len(prompts)} prompts, {min(map(len, prompts))}-{max(map(len, prompts))} tokens; end of turn {eos}",
          flush=True)
    run = Run(args.json, args.budget_s, dict(model=os.path.basename(args.model), gpu=str(jax.devices()[0].device_kind),
                                             jax=jax.__version__, args=vars(args)))
    models = Models(args)
    ours = {}
    if "plain" in parts:
        ours = part_plain(run, models, prompts, batches, args)
    modes = [m for m in args.modes.split(",") if m]
    if any(m not in ("default", "invariant") for m in modes):
        raise SystemExit(f"--modes: expected default and/or invariant, got {args.modes!r}")
    if "spec" in parts:
        for mode in modes:
            part_spec(run, models, prompts, batches, args, eos, mode)
    if "hf" in parts and run.time_left():
        part_hf(run, prompts, batches, args, ours)
    if args.png:
        plot(run.doc, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())

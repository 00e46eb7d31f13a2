"""Demo: speculative decoding of real text with SmolLM2-135M-Instruct and its trained draft head vs plain decoding.

``python -m jaxspec.demo [--device cpu|gpu] [--config chain|tree|both] [--head DIR] [--prompts 3] [--max-new 96]
[--repeats 3]``

Fetches SmolLM2-135M-Instruct into the user cache when it is missing (``python -m jaxspec.models.fetch
smollm2-135m-instruct``: ~98 MB, hash-checked), loads it in float32 with its tokenizer and chat template
(``jaxspec.text``), and the draft head shipped for it: the EAGLE-3 head in ``SHIPPED_HEADS["eagle3"]`` (a
one-layer draft over an 8192-token draft vocabulary) when present, else the MTP head in
``SHIPPED_HEADS["mtp"]`` (``--head DIR`` picks another head, e.g. one ``python -m jaxspec.train_draft`` wrote).
Each of the demo's chat prompts (``PROMPTS``, written for the demo: none is from MT-Bench, HumanEval or GSM8K)
goes through the chat template and is decoded greedily at batch 1, plainly, with a chain (``SpecConfig(3, 1,
4)``) and with a tree (``SpecConfig(3, 2, 6)``), each reply ending at the model's end-of-turn token. The demo
checks that every mode's reply is identical to plain decoding token for token (prints "outputs identical", else
exits 1) and prints one table row per mode: mode, mean accept length, tokens/s, run s (the fastest of
``--repeats`` interleaved timed runs per prompt, summed over the prompts; prefill included), compile s (each
mode's first run per prompt, which compiles), median s; then each speculative mode's speed-up over plain
decoding, split into tokens per round and the cost of a round in plain decode steps, and where a round's time
goes: the verify forward, the draft (``propose`` + the extend after verify) and the rest (bookkeeping), each
timed alone, with the acceptance per draft position. The H200 figures (``H200_FIGURES``) are printed beside
them, labelled. Then the replies.

``--weights DIR`` runs the same demo on a target + MTP pair checkpoint instead (the shipped toy pairs,
``jaxspec/assets/demo_pair`` and ``tiny_pair``: synthetic corpus prompts, mock vocabulary).

The fastest run is the measure (as ``timeit``'s): on a shared CPU other processes only ever add time; the median
is printed beside it. On CPU every mode runs under the same XLA:CPU options, chosen per model (``CPU_XLA_FLAGS``,
process-wide, set before JAX starts).
"""

import argparse
import json
import os
import sys
import time

from jaxspec.cli_help import parser
from jaxspec.data.chat_prompts import CHAT_PROMPTS

MODEL = "smollm2-135m-instruct"
_HERE = os.path.dirname(os.path.abspath(__file__))
HEADS_DIR = os.path.join(_HERE, "assets", "heads")
# The heads trained for MODEL by python -m jaxspec.train_draft (the EAGLE-3 one is preferred).
SHIPPED_HEADS = {"eagle3": os.path.join(HEADS_DIR, f"{MODEL}-eagle3"), "mtp": os.path.join(HEADS_DIR, f"{MODEL}-mtp")}
CONFIGS = {"chain": (3, 1, 4), "tree": (3, 2, 6)}  # SpecConfig(num_steps, topk, num_draft_tokens)
TARGET_SPEEDUP = 1.5  # what speculation should reach over plain decoding at batch 1 on CPU

PROMPTS = CHAT_PROMPTS  # the demo's chat prompts (jaxspec.data.chat_prompts: written for jaxspec)

# The same demo on the H200 (SmolLM2, the shipped head, batch 1): mode -> (accept len, tokens/s). Filled from an
# H200 run of `python -m jaxspec.demo --device gpu`; printed beside this machine's figures, labelled.
H200_FIGURES: dict = {}
H200_FIGURES_SOURCE = ""  # where the H200 figures come from (date, commit), printed with them

# XLA:CPU options per model kind (every mode runs under them; set before JAX starts its CPU backend, so only when
# the demo starts it). An option already in XLA_FLAGS keeps the user's value. Measured with jaxlib 0.10.2 on this
# repo's 2-core CPU (bench/cpu_forward_probe.py; BENCHMARKS.md, "The CPU demo"):
# * "model" (SmolLM2 in f32): none. jaxlib 0.10 hands multi-row f32 matmuls to YNNPACK and single rows to XLA's own
#   GEMV; turning YNNPACK off (--xla_cpu_experimental_ynn_fusion_type=) sends a verify forward's 2-6-row matmuls to
#   Eigen, which made a 4-row forward of SmolLM2 cost 5-12 one-row forwards instead of 1.5-1.8.
# * "pair" (the 24-layer, 32-wide toy pair): YNNPACK off and single-threaded Eigen: at 32 wide the YNNPACK call
#   costs more than the matmul, and Eigen's multi-threaded dots pay a thread hand-off per tiny matmul.
# Added only for the jaxlib versions they were measured with (XLA aborts on an option it does not know).
CPU_XLA_FLAGS = {
    "model": {},
    "pair": {"--xla_cpu_experimental_ynn_fusion_type": "", "--xla_cpu_multi_thread_eigen": "false"},
}
CPU_XLA_FLAGS_JAXLIB = ("0.10.",)
# --draft-vocab auto on the CPU: the shipped EAGLE-3 head's 8192 most frequent of its 24576 draft tokens cover 98.3% of
# its training replies' tokens, give the demo's replies the same accept lengths, and halve the draft's time per round
# on the 2-core CPU (BENCHMARKS.md, the CPU demo on real text).
CPU_DRAFT_VOCAB = 8192


def _parser() -> argparse.ArgumentParser:
    ap = parser("jaxspec.demo", "Speculative decoding of real text vs plain decoding: SmolLM2-135M-Instruct "
                "(fetched into the user cache when missing) with its trained draft head, a few chat prompts decoded "
                "greedily at batch 1 each way (each generation one XLA while_loop); checks the outputs are identical "
                "token for token (exit 1 if not) and prints the mean accept length, tokens/s, where a round's time "
                "goes and the replies.")
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                    help="JAX platform to run on (default: %(default)s)")
    ap.add_argument("--config", choices=["chain", "tree", "both"], default="both",
                    help="speculation shape: chain (3 steps, top-1, 4 draft tokens), tree (3 steps, top-2, "
                         "6 draft tokens) or both (default: %(default)s)")
    ap.add_argument("--head", default=None, metavar="DIR",
                    help="draft head directory: an EAGLE-3 checkpoint (config.json + model.safetensors) or an MTP "
                         "head (config.json + mtp.safetensors), as python -m jaxspec.train_draft writes them "
                         "(default: the shipped head, SHIPPED_HEADS in jaxspec/demo.py)")
    ap.add_argument("--draft-vocab", default="auto", metavar="N|all|auto",
                    help="an EAGLE-3 head's draft vocabulary: its N most frequent training tokens (load_eagle3's "
                         "draft_vocab; each draft step then reads N rows of its LM head), all of them, or auto: "
                         f"{CPU_DRAFT_VOCAB} on the CPU where the head records its token counts and has more, all "
                         "otherwise (default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=3,
                    help=f"how many of the demo's {len(PROMPTS)} chat prompts to decode (default: %(default)s)")
    ap.add_argument("--max-new", type=int, default=96, help="most tokens generated per reply (default: %(default)s)")
    ap.add_argument("--page-size", type=int, default=16, help="tokens per KV cache page (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs per mode and prompt after the first (compiling) run, interleaved across "
                         "modes; the table shows the fastest and the median (default: %(default)s)")
    ap.add_argument("--weights", default=None, metavar="DIR",
                    help="run on a target + MTP pair checkpoint directory instead (e.g. jaxspec/assets/demo_pair: "
                         "synthetic corpus prompts, mock vocabulary)")
    return ap


def _parse(argv):
    args = _parser().parse_args(argv)
    for name in ("prompts", "max_new", "page_size", "repeats"):
        if getattr(args, name) < 1:
            _parser().error(f"--{name.replace('_', '-')}: expected an int >= 1, got {getattr(args, name)}")
    if args.weights is None and args.prompts > len(PROMPTS):
        _parser().error(f"--prompts: the demo has {len(PROMPTS)} chat prompts, got {args.prompts}")
    if args.weights is not None and args.head is not None:
        _parser().error("--head: a --weights pair carries its own MTP layers; give one of --weights and --head")
    if args.draft_vocab not in ("auto", "all"):
        if not args.draft_vocab.isdigit() or int(args.draft_vocab) < 1:
            _parser().error(f"--draft-vocab: expected an int >= 1, 'all' or 'auto', got {args.draft_vocab!r}")
        if args.weights is not None:
            _parser().error("--draft-vocab: applies to an EAGLE-3 head, not to a --weights pair")
    return args


def draft_vocab_for(choice: str, path: str, kind: str, device: str) -> int | None:
    """The ``draft_vocab`` to load a head with (``None``: all its draft tokens) for ``--draft-vocab choice``."""
    from jaxspec.models.eagle3 import COUNTS_FILE

    if choice == "all":
        return None
    if choice != "auto":
        if kind != "eagle3":
            raise ValueError(f"--draft-vocab {choice}: applies to an EAGLE-3 head, {path} is an {kind} head")
        return int(choice)
    if kind != "eagle3" or device != "cpu" or not os.path.exists(os.path.join(path, COUNTS_FILE)):
        return None
    with open(os.path.join(path, "config.json")) as f:
        vd = int(json.load(f).get("draft_vocab_size") or 0)
    return CPU_DRAFT_VOCAB if vd > CPU_DRAFT_VOCAB else None


def cpu_xla_flags(current: str, jaxlib_version: str, flags: dict) -> str:
    """``current`` (an ``XLA_FLAGS`` value) plus the options of ``flags`` (a ``CPU_XLA_FLAGS`` entry) it does not
    set already, for a jaxlib version in ``CPU_XLA_FLAGS_JAXLIB``; else ``current`` unchanged."""
    if not jaxlib_version.startswith(CPU_XLA_FLAGS_JAXLIB):
        return current
    have = {f.split("=", 1)[0] for f in current.split()}
    extra = [f"{k}={v}" for k, v in flags.items() if k not in have]
    return " ".join(([current.strip()] if current.strip() else []) + extra)


def find_head(head: str | None, shipped: dict | None = None) -> tuple[str, str]:
    """``(path, kind)`` of the draft head: ``head`` when given, else the first shipped head that exists (EAGLE-3,
    then MTP); ``FileNotFoundError`` naming what was looked for when there is none."""
    from jaxspec.models import head_kind

    if head is not None:
        if not os.path.isdir(head):
            raise FileNotFoundError(f"--head {head}: no such directory")
        return head, head_kind(head, arg="--head")
    shipped = SHIPPED_HEADS if shipped is None else shipped
    for kind, path in shipped.items():
        if os.path.isdir(path):
            found = head_kind(path, arg="--head")
            if found != kind:
                raise ValueError(f"{path}: expected an {kind} head, found an {found} one")
            return path, kind
    raise FileNotFoundError(
        f"no draft head for {MODEL}: looked for the EAGLE-3 head {shipped.get('eagle3')} and the MTP head "
        f"{shipped.get('mtp')}. Train one (python -m jaxspec.train_draft --target <{MODEL} .gguf> --arch eagle3 "
        f"--out DIR) and pass --head DIR/eagle3")


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else as an absolute path."""
    rel = os.path.relpath(path)
    return os.path.abspath(path) if rel.startswith("..") else rel


class Setup:
    """What the demo decodes with: the target, a drafter, the prompts as token ids, how to show a reply."""

    def __init__(self, name, target, drafter, prompts, texts, show, eos_id, stop_ids, what):
        self.name, self.target, self.drafter = name, target, drafter
        self.prompts, self.texts, self.show = prompts, texts, show
        self.eos_id, self.stop_ids, self.what = eos_id, stop_ids, what


def load_model_setup(head: str | None, num_prompts: int, draft_vocab: str = "all", device: str = "cpu") -> Setup:
    """SmolLM2 (fetched when missing) in float32 with the draft head ``find_head(head)`` (an EAGLE-3 head's draft
    vocabulary as ``--draft-vocab draft_vocab`` picks on ``device``) and the chat prompts."""
    import jax.numpy as jnp

    from jaxspec.models import fetch_model, load_target_with_head
    from jaxspec.text import Tokenizer

    path, kind = find_head(head)
    gguf = str(fetch_model(MODEL, quiet=True))
    tok = Tokenizer.from_file(gguf)
    vd = draft_vocab_for(draft_vocab, path, kind, device)
    target, drafter, _ = load_target_with_head(gguf, path, kind=kind, param_dtype=jnp.float32,
                                               num_draft_steps=max(c[0] for c in CONFIGS.values())
                                               if kind == "mtp" else None, draft_vocab=vd)
    if kind == "eagle3":
        cfg = drafter.model.cfg
        kept = "" if vd is None else " most frequent (--draft-vocab)"
        what = (f"EAGLE-3 head {_shown(path)} (1 layer, draft vocabulary {cfg.draft_vocab_size}{kept}, "
                f"aux layer ids {list(cfg.aux_layer_ids)})")
    else:
        what = f"MTP head {_shown(path)} ({target.num_mtp_layers} layer(s), full vocabulary)"
    texts = list(PROMPTS[:num_prompts])
    prompts = [tok.encode_chat([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts]
    eot = tok.end_of_turn_token_id
    stops = set(tok.chat_stop_token_ids)

    def show(ids):
        ids = [int(i) for i in ids]
        cut = next((k for k, t in enumerate(ids) if t in stops), len(ids))
        return tok.decode(ids[:cut], skip_special_tokens=True)

    eos = eot if eot is not None else (min(stops) if stops else None)
    return Setup(f"{MODEL} (f32, {os.path.basename(gguf)})", target, drafter, prompts, texts, show, eos, stops,
                 what)


def load_pair_setup(weights: str, num_prompts: int) -> Setup:
    """A target + MTP pair checkpoint (the toy pairs) with corpus prompts and the mock vocabulary."""
    import jax.numpy as jnp

    from jaxspec.corpus import make_prompts
    from jaxspec.models import MockVocab, load_target_with_head

    model, drafter, _ = load_target_with_head(weights, kind="builtin", kv_dtype=jnp.float32)
    vocab = MockVocab(vocab_size=model.vocab_size)
    texts = make_prompts(num_prompts)
    return Setup(f"pair {_shown(weights)} ({model.cfg.num_hidden_layers} layers)", model,
                 drafter, [vocab.encode(t) for t in texts], texts, vocab.decode, None, set(),
                 f"its {model.num_mtp_layers} MTP layers")


# ------------------------------------------------------------------------------------------- decoding
def decode_timed(eng, ids, max_new):
    """One batch-1 generation (prefill, then the decode ``while_loop``; inputs prepared first): ``(state, seconds,
    prefill seconds)``."""
    import jax

    inputs = jax.block_until_ready(eng.prepare([ids], max_new))
    t0 = time.perf_counter()
    state = jax.block_until_ready(eng.run_prefill(*inputs))
    t1 = time.perf_counter()
    state = jax.block_until_ready(eng.run_decode(state))
    return state, time.perf_counter() - t0, t1 - t0


def decode_rounds(eng, ids, max_new):
    """One batch-1 generation one round per call (the same executables as ``decode_timed``): ``(state, seconds,
    accept lengths of its rounds)``."""
    import jax
    import numpy as np

    inputs = jax.block_until_ready(eng.prepare([ids], max_new))
    t0 = time.perf_counter()
    state = eng.run_prefill(*inputs)
    accepted, lens = int(np.asarray(state.num_accepted)[0]), []
    while not bool(np.asarray(state.done)[0]):
        state = eng.run_decode(state, max_rounds=1)
        now = int(np.asarray(state.num_accepted)[0])
        lens.append(now - accepted)
        accepted = now
    return state, time.perf_counter() - t0, lens


def acceptance_per_position(accept_lens, num_steps: int) -> list[float]:
    """Fraction of rounds whose draft token at depth ``k`` (``1..num_steps``) was accepted: accept length > k."""
    n = max(1, len(accept_lens))
    return [sum(1 for a in accept_lens if a > k) / n for k in range(1, num_steps + 1)]


# ------------------------------------------------------------------------------------------- breakdown
def _jit_over(models, fn):
    """``fn(models, *args)`` jitted with ``models`` (modules / pytrees) split once and passed as arrays, as the
    engine passes them (no weights baked into the executable)."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(models)
    jitted = jax.jit(lambda st, *a: fn(nnx.merge(graphdef, st), *a))
    return lambda *a: jitted(state, *a)


def fastest_interleaved(calls: dict, repeats: int) -> dict:
    """Seconds of each zero-argument jitted call in ``calls``: one untimed call each (the compile), then
    ``repeats`` rounds calling each once in turn (so a change in the machine's load hits all alike); the fastest."""
    import jax

    for fn in calls.values():
        jax.block_until_ready(fn())
    best = {k: float("inf") for k in calls}
    for _ in range(repeats):
        for k, fn in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def _window(rows: int, prefix: int, page_size: int):
    """A batch-1 slot table and the metadata of ``rows`` fresh tokens after ``prefix`` committed ones (causal,
    K/V written past the prefix)."""
    import jax.numpy as jnp

    from jaxspec.models import make_req_to_token
    from jaxspec.protocols import AttentionMetadata, page_table_from_req_to_token
    from jaxspec.pipeline import causal_qmask

    width = -(-(prefix + rows + 1) // page_size) * page_size
    r2t = jnp.asarray(make_req_to_token(1, width, page_size))
    meta = AttentionMetadata(positions=prefix + jnp.arange(rows, dtype=jnp.int32)[None], qmask=causal_qmask(1, rows),
                             prefix_lens=jnp.array([prefix], jnp.int32),
                             page_table=page_table_from_req_to_token(r2t, page_size),
                             write_locs=r2t[:, prefix:prefix + rows], page_size=page_size)
    return r2t, meta


def forward_call(target, rows: int, prefix: int, page_size: int):
    """A zero-argument call of the target's jitted forward over ``rows`` fresh tokens after ``prefix`` committed
    ones (batch 1, K/V written): what a plain step (1 row) or a verify (N rows) runs."""
    import jax.numpy as jnp

    r2t, meta = _window(rows, prefix, page_size)
    cache = target.make_cache(r2t, int(r2t.max()) + 1)
    fwd = _jit_over(target, lambda m, t, meta, c: m.forward(t, meta, c)[0].argmax(-1))
    tokens = jnp.ones((1, rows), jnp.int32)
    return lambda: fwd(tokens, meta, cache)


def draft_call(target, drafter, spec, prefix: int, page_size: int):
    """A zero-argument call of a round's draft work alone, jitted: ``propose`` from the committed prefix plus the
    extend over the ``N``-token verify window (batch 1)."""
    import jax.numpy as jnp

    from jaxspec.pipeline import root_metadata

    n = spec.num_draft_tokens
    r2t, window = _window(n, prefix, page_size)
    root = root_metadata(window.prefix_lens, r2t, page_size=page_size)
    state = drafter.init_state(spec, r2t, int(r2t.max()) + 1)
    tokens = jnp.ones((1, n), jnp.int32)
    hidden = jnp.zeros((1, n, int(target.feature_size)), jnp.float32)
    accept = jnp.array([2], jnp.int32)

    def work(models, st):
        d = models[1]
        drafts, st = d.propose(spec, st, tokens[:, 0], root)
        return drafts, d.extend_after_verify(spec, st, tokens, hidden, window, accept)

    fn = _jit_over((target, drafter), work)  # the drafter may share the target's weights (split together)
    return lambda: fn(state)


# ------------------------------------------------------------------------------------------- report
WHY = (
    "why: a round = one target forward over its N verify tokens + the draft + bookkeeping (tree build, acceptance,\n"
    "  KV moves). Where a forward is bound by reading the weights (a GPU at model scale; on the H200 a batch-1 chain\n"
    "  round of an 8B-shaped target costs ~1.15 plain decode steps, BENCHMARKS.md), verifying N tokens costs about\n"
    "  one step and the speed-up approaches the accept length. {cpu}"
)
WHY_CPU = (
    "On this CPU a verify forward costs\n"
    "  {ratios} one-row forwards, so a round costs more than a step and the speed-up is\n"
    "  the accept length over that cost (bench/cpu_forward_probe.py times the forwards by row count)."
)


def _table(results, run_s, compile_s, median_s):
    lines = [f"{'mode':<8}{'accept len':>12}{'tokens/s':>12}{'run s':>10}{'compile s':>11}{'median s':>10}"]
    for name in results:
        toks = sum(len(t) for t in results[name]["tokens"])
        lines.append(f"{name:<8}{results[name]['accept']:>12.3f}{toks / run_s[name]:>12.1f}{run_s[name]:>10.3f}"
                     f"{compile_s[name]:>11.1f}{median_s[name]:>10.3f}")
    return "\n".join(lines)


def _rest_ms(total_s: float, *parts_s: float) -> str:
    """``total - sum(parts)`` in ms for the breakdown; the parts are timed alone, in other runs than the total, so
    a residual below zero is timing noise and is printed as such, never as a negative time."""
    rest = total_s - sum(parts_s)
    if rest >= 0:
        return f"{1e3 * rest:.1f} ms"
    return f"~0 ms (the parts, timed alone, add up to {1e3 * -rest:.1f} ms more than the loop's: timing noise)"


def main(argv=None) -> int:
    args = _parse(argv)
    # Pick the platform (and XLA:CPU's options) before JAX initialises a backend.
    os.environ["JAX_PLATFORMS"] = "cpu" if args.device == "cpu" else "cuda"
    if args.device == "cpu":
        from importlib.metadata import version

        flags = CPU_XLA_FLAGS["pair" if args.weights else "model"]
        os.environ["XLA_FLAGS"] = cpu_xla_flags(os.environ.get("XLA_FLAGS", ""), version("jaxlib"), flags)
    import jax
    import numpy as np
    from tqdm import tqdm

    from jaxspec.config import SpecConfig
    from jaxspec.engine import Engine

    t_load = time.perf_counter()
    try:
        setup = (load_pair_setup(args.weights, args.prompts) if args.weights
                 else load_model_setup(args.head, args.prompts, args.draft_vocab, args.device))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    load_s = time.perf_counter() - t_load
    names = ["chain", "tree"] if args.config == "both" else [args.config]
    specs = {n: SpecConfig(*CONFIGS[n]) for n in names}
    width = max(len(p) for p in setup.prompts) + args.max_new + max(s.num_draft_tokens for s in specs.values())
    max_context = -(-width // args.page_size) * args.page_size
    print(f"model: {setup.name}; draft: {setup.what}; loaded in {load_s:.1f} s")
    print(f"device: {jax.devices()[0]}  batch 1  prompts {len(setup.prompts)} (lengths "
          f"{[len(p) for p in setup.prompts]})  max_new {args.max_new}  page size {args.page_size}")
    if args.device == "cpu":
        print(f"XLA_FLAGS (every mode): {os.environ['XLA_FLAGS'] or '(none)'}")

    kw = dict(max_context=max_context, page_size=args.page_size, max_batch=1, eos_id=setup.eos_id)
    engines = {"plain": Engine(setup.target, None, spec=None, **kw)}
    for n in names:
        engines[n] = Engine(setup.target, setup.drafter, spec=specs[n], **kw)
    tokens = {m: [None] * len(setup.prompts) for m in engines}
    rounds = {m: [0] * len(setup.prompts) for m in engines}
    accept_lens = {m: [] for m in engines}
    compile_s = {m: 0.0 for m in engines}
    times = {m: [[] for _ in setup.prompts] for m in engines}
    decode_times = {m: [[] for _ in setup.prompts] for m in engines}  # the same runs less their prefill
    with tqdm(total=len(engines) * len(setup.prompts) * (1 + args.repeats), desc="demo", unit="run") as bar:
        for i, ids in enumerate(setup.prompts):
            for m, eng in engines.items():  # first run: compiles (a new prefill bucket) and records every round
                bar.set_postfix_str(f"prompt {i + 1} {m} (first run)")
                state, s, lens = decode_rounds(eng, ids, args.max_new)
                compile_s[m] += s
                accept_lens[m] += lens
                res = Engine.result(state)
                tokens[m][i], rounds[m][i] = res.tokens[0], int(res.num_rounds[0])
                bar.update()
            for _ in range(args.repeats):  # interleaved, so a change in the machine's load hits every mode alike
                for m, eng in engines.items():
                    bar.set_postfix_str(f"prompt {i + 1} {m}")
                    state, s, prefill_s = decode_timed(eng, ids, args.max_new)
                    times[m][i].append(s)
                    decode_times[m][i].append(s - prefill_s)
                    if not np.array_equal(Engine.result(state).tokens[0], tokens[m][i]):
                        print(f"{m}: prompt {i}: a timed run decoded other tokens than the first run")
                        return 1
                    bar.update()
    run_s = {m: float(sum(min(t) for t in times[m])) for m in engines}
    loop_s = {m: float(sum(min(t) for t in decode_times[m])) for m in engines}  # decode loops alone
    median_s = {m: float(sum(np.median(t) for t in times[m])) for m in engines}
    results = {m: {"tokens": tokens[m], "accept": float(np.mean(accept_lens[m])) if m != "plain" else 1.0}
               for m in engines}

    ok = True
    for m in names:
        bad = [i for i, (a, b) in enumerate(zip(tokens[m], tokens["plain"])) if not np.array_equal(a, b)]
        ok &= not bad
        if bad:
            print(f"{m}: outputs DIFFER from plain decoding for prompts {bad}")
    print()
    print(_table(results, run_s, compile_s, median_s))
    print()
    step_s = loop_s["plain"] / max(1, sum(rounds["plain"]))  # one decode-loop iteration: a plain step or a round
    speedups = {}
    for m in names:
        round_s = loop_s[m] / max(1, sum(rounds[m]))
        speedups[m] = run_s["plain"] / run_s[m]
        print(f"{m}: {speedups[m]:.2f}x plain tokens/s ({results[m]['accept']:.2f} tokens per round; a round costs "
              f"{round_s / step_s:.2f} plain decode steps; medians: {median_s['plain'] / median_s[m]:.2f}x)")

    # Where a round's time goes: its parts timed alone at the prompts' mean context, interleaved.
    prefix = int(np.mean([len(p) for p in setup.prompts])) + args.max_new // 2
    reps = max(5, 2 * args.repeats)
    calls = {"forward 1": forward_call(setup.target, 1, prefix, args.page_size)}
    for m in names:
        n = specs[m].num_draft_tokens
        calls.setdefault(f"forward {n}", forward_call(setup.target, n, prefix, args.page_size))
        calls[f"draft {m}"] = draft_call(setup.target, setup.drafter, specs[m], prefix, args.page_size)
    part = fastest_interleaved(calls, reps)
    one = part["forward 1"]
    ratios = {}
    print()
    loop_step = step_s
    print(f"where the time goes (each part alone, fastest of {reps} interleaved, context {prefix}; a step and a round "
          f"from the decode loops less prefill): a plain step {1e3 * loop_step:.1f} ms = a one-row target forward "
          f"{1e3 * one:.1f} ms + the rest (bookkeeping, loop) {_rest_ms(loop_step, one)}")
    for m in names:
        spec = specs[m]
        verify, draft = part[f"forward {spec.num_draft_tokens}"], part[f"draft {m}"]
        round_s = loop_s[m] / max(1, sum(rounds[m]))
        ratios[m] = verify / one
        acc = acceptance_per_position(accept_lens[m], spec.num_steps)
        print(f"  {m}: round {1e3 * round_s:.1f} ms = verify forward ({spec.num_draft_tokens} rows) "
              f"{1e3 * verify:.1f} ms ({verify / one:.2f} one-row forwards) + draft (propose {spec.num_steps} steps + "
              f"extend over {spec.num_draft_tokens} rows) {1e3 * draft:.1f} ms + the rest (bookkeeping, loop) "
              f"{_rest_ms(round_s, verify, draft)}")
        print(f"  {m}: drafts accepted per position (of {len(accept_lens[m])} rounds): "
              + ", ".join(f"{k + 1}: {a:.0%}" for k, a in enumerate(acc)))
    if args.device == "cpu":
        cpu = WHY_CPU.format(ratios=" / ".join(f"{r:.2f} ({m}, {specs[m].num_draft_tokens} rows)"
                                               for m, r in ratios.items()))
    else:
        cpu = ""
    print(WHY.format(cpu=cpu))
    best = max(speedups.values())
    if args.weights is None and args.device == "cpu":
        verdict = "met" if best >= TARGET_SPEEDUP else "NOT met"
        print(f"target on this CPU: speculative >= {TARGET_SPEEDUP}x plain tokens/s at batch 1: {verdict} "
              f"(best {best:.2f}x)")
    if H200_FIGURES and args.weights is None:
        print(f"the same demo on the H200 ({H200_FIGURES_SOURCE}):")
        plain_h = H200_FIGURES.get("plain", (1.0, 0.0))[1]
        for m, (acc_len, tps) in H200_FIGURES.items():
            extra = f"  {tps / plain_h:.2f}x plain" if m != "plain" and plain_h else ""
            print(f"  H200 {m:<6} accept len {acc_len:.3f}  tokens/s {tps:.1f}{extra}")
    print()
    for i, t in enumerate(setup.texts):
        print(f"  {t!r}\n    -> {setup.show(tokens['plain'][i])!r}")
    print()
    if not ok:
        print("outputs differ")
        return 1
    print("outputs identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())

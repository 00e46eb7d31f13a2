"""Loading a Hugging Face checkpoint directory reads only its own regular files and never loads the wrong
weights silently: index entries that leave the directory (``..``, absolute paths, escaping symlinks) and
FIFOs are refused before anything is read (without blocking); integer tensors and quantized configs are
refused; a tensor in two un-indexed files is an error; a tied config with a differing ``lm_head.weight``
loads both as transformers does; bad ``config.json`` fields are named; the layer count is checked against
the tensors before the model is built; ``strict`` decides about tensors with no place; peak RSS while
loading stays within 1.5x the checkpoint (slow)."""

import json
import os
import subprocess
import sys
import textwrap
import time

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from jaxspec.models.checkpoint import load_model, load_weights, read_config, save_model
from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder

CFG = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=16)
INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved random checkpoint directory and its tensors."""
    path = tmp_path_factory.mktemp("ckpt") / "model"
    save_model(Decoder(CFG, rngs=nnx.Rngs(0)), str(path))
    return path, load_file(path / "model.safetensors")


def _write(path, tensors, config=None, shards=None):
    """A checkpoint directory: ``config.json`` (default ``CFG``'s) and ``tensors`` in one file, or in ``shards``
    (file name -> tensor names) with an index."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(CFG.to_hf() if config is None else config))
    if shards is None:
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
        return path
    for fn, names in shards.items():
        save_file({k: tensors[k] for k in names}, path / fn, metadata={"format": "pt"})
    (path / INDEX).write_text(json.dumps({"weight_map": {k: fn for fn, names in shards.items() for k in names}}))
    return path


def _sharded(tmp_path, tensors, second="model-2.safetensors"):
    """Half the tensors in ``model-1.safetensors``, half in ``second`` (as the index names it)."""
    names = sorted(tensors)
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CFG.to_hf()))
    save_file({k: tensors[k] for k in names[::2]}, d / "model-1.safetensors")
    weight_map = {k: "model-1.safetensors" for k in names[::2]} | {k: second for k in names[1::2]}
    (d / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    return d, {k: tensors[k] for k in names[1::2]}


def _load_in_subprocess(path, timeout=60):
    """``load_model(path)`` in a child process: (returncode, stderr); a hang shows as a timeout, not a stuck run."""
    code = f"from jaxspec.models.checkpoint import load_model; load_model({str(path)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    return r.returncode, r.stderr


# ---------------------------------------------------------------------------------------------------- paths


@pytest.mark.parametrize("where", ["parent", "absolute", "nested_parent"])
def test_index_entries_outside_the_directory_are_refused(tmp_path, saved, where):
    _, tensors = saved
    outside = tmp_path / "outside"
    outside.mkdir()
    names = {"parent": "../outside/evil.safetensors", "absolute": str(outside / "evil.safetensors"),
             "nested_parent": "sub/../../outside/evil.safetensors"}
    d, rest = _sharded(tmp_path, tensors, names[where])
    save_file(rest, outside / "evil.safetensors")
    with pytest.raises(ValueError, match=r"shard .*evil\.safetensors.*(relative file name|outside)"):
        load_model(str(d))


def test_symlink_escaping_the_directory_is_refused(tmp_path, saved):
    _, tensors = saved
    d, rest = _sharded(tmp_path, tensors)
    (tmp_path / "elsewhere").mkdir()
    save_file(rest, tmp_path / "elsewhere" / "evil.safetensors")
    os.symlink(tmp_path / "elsewhere" / "evil.safetensors", d / "model-2.safetensors")
    with pytest.raises(ValueError, match=r"model-2\.safetensors' resolves to .*outside the checkpoint directory"):
        load_model(str(d))
    # without an index, every *.safetensors is checked the same way
    os.remove(d / INDEX)
    with pytest.raises(ValueError, match=r"model-2\.safetensors' resolves to .*outside"):
        load_model(str(d))
    # a symlinked config.json leading out is refused too
    linked = _write(tmp_path / "linked", tensors)
    os.remove(linked / "config.json")
    (tmp_path / "cfg.json").write_text(json.dumps(CFG.to_hf()))
    os.symlink(tmp_path / "cfg.json", linked / "config.json")
    with pytest.raises(ValueError, match=r"config\.json' resolves to .*outside"):
        load_model(str(linked))


def test_symlinks_inside_the_directory_and_the_hub_cache_layout_load(tmp_path, saved):
    path, tensors = saved
    want = load_model(str(path))
    d = tmp_path / "inside"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(CFG.to_hf()))
    (d / "weights").mkdir()
    save_file(tensors, d / "weights" / "w.bin")
    os.symlink("weights/w.bin", d / "model.safetensors")
    got = load_model(str(d))
    np.testing.assert_array_equal(got.embed_tokens[...], want.embed_tokens[...])
    # huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
    repo = tmp_path / "models--x--y"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    (blobs / "c0nf").write_text(json.dumps(CFG.to_hf()))
    save_file(tensors, blobs / "w8ts")
    os.symlink("../../blobs/c0nf", snap / "config.json")
    os.symlink("../../blobs/w8ts", snap / "model.safetensors")
    got = load_model(str(snap))
    np.testing.assert_array_equal(got.embed_tokens[...], want.embed_tokens[...])


@pytest.mark.parametrize("named_by_index", [False, True])
def test_fifo_is_refused_without_blocking(tmp_path, saved, named_by_index):
    _, tensors = saved
    if named_by_index:
        d, _ = _sharded(tmp_path, tensors)
        os.mkfifo(d / "model-2.safetensors")
    else:
        d = _write(tmp_path / "ckpt", tensors)
        os.mkfifo(d / "extra.safetensors")
    t0 = time.monotonic()
    rc, err = _load_in_subprocess(d)
    assert rc != 0 and "is not a regular file" in err, err[-2000:]
    assert time.monotonic() - t0 < 60


def test_fifo_config_or_index_is_refused(tmp_path, saved):
    _, tensors = saved
    d = _write(tmp_path / "a", tensors)
    os.remove(d / "config.json")
    os.mkfifo(d / "config.json")
    rc, err = _load_in_subprocess(d)
    assert rc != 0 and "config.json' is not a regular file" in err, err[-2000:]
    d = _write(tmp_path / "b", tensors)
    os.mkfifo(d / INDEX)
    rc, err = _load_in_subprocess(d)
    assert rc != 0 and "index.json' is not a regular file" in err, err[-2000:]


def test_index_must_match_its_shards(tmp_path, saved):
    _, tensors = saved
    d, rest = _sharded(tmp_path, tensors)
    one = sorted(rest)[0]
    save_file({k: v for k, v in rest.items() if k != one}, d / "model-2.safetensors")
    with pytest.raises(ValueError, match=rf"maps tensor {one} to model-2\.safetensors, which holds no such tensor"):
        load_model(str(d))
    (d / INDEX).write_text(json.dumps({"weight_map": ["model-1.safetensors"]}))
    with pytest.raises(ValueError, match="weight_map"):
        load_model(str(d))
    (d / INDEX).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(str(d))


# ---------------------------------------------------------------------------------------------------- weights


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.bool_])
def test_integer_tensors_are_refused(tmp_path, saved, dtype):
    _, tensors = saved
    name = "model.layers.1.mlp.down_proj.weight"
    bad = {**tensors, name: np.ones(tensors[name].shape, dtype)}
    d = _write(tmp_path / "ckpt", bad)
    with pytest.raises(ValueError, match=rf"tensor {name} \(model\.safetensors\) has dtype [IUB]"):
        load_model(str(d))


def test_quantization_config_is_refused(tmp_path, saved):
    _, tensors = saved
    q = {"quant_method": "bitsandbytes", "load_in_8bit": True}
    d = _write(tmp_path / "ckpt", tensors, config={**CFG.to_hf(), "quantization_config": q})
    with pytest.raises(ValueError, match="quantization_config.*bitsandbytes"):
        load_model(str(d))
    # bitsandbytes' int8 layout (int8 weight + SCB scales), without the config, is refused by dtype
    name = "model.layers.0.self_attn.q_proj.weight"
    bnb = {**tensors, name: np.ones(tensors[name].shape, np.int8),
           name.replace("weight", "SCB"): np.ones(tensors[name].shape[0], np.float32)}
    d = _write(tmp_path / "bnb", bnb)
    with pytest.raises(ValueError, match=rf"{name} .*dtype I8"):
        load_model(str(d))


def test_tensor_in_two_files_without_index_is_an_error(tmp_path, saved):
    _, tensors = saved
    d = _write(tmp_path / "ckpt", tensors)
    name = "model.norm.weight"
    save_file({name: np.zeros(32, np.float32)}, d / "model-extra.safetensors")
    with pytest.raises(ValueError, match=rf"tensor {name} is in both model-extra\.safetensors and model\.safetensors"):
        load_model(str(d))


def test_bf16_and_f16_files_cast_into_param_dtype(tmp_path, saved):
    import ml_dtypes

    _, tensors = saved
    for src, dt in (("bf16", ml_dtypes.bfloat16), ("f16", np.float16)):
        d = _write(tmp_path / src, {k: v.astype(dt) for k, v in tensors.items()})
        for param_dtype in (jnp.float32, jnp.bfloat16):
            m = load_model(str(d), param_dtype=param_dtype)
            emb = m.embed_tokens[...]
            assert emb.dtype == param_dtype
            want = tensors["model.embed_tokens.weight"].astype(dt).astype(np.float32)
            np.testing.assert_array_equal(np.asarray(emb, np.float32), want.astype(param_dtype).astype(np.float32))


def _transformers_lm_head(d):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    return model.lm_head.weight.detach().numpy(), model.model.embed_tokens.weight.detach().numpy()


def test_tied_config_with_a_differing_lm_head_loads_it_as_transformers_does(tmp_path, saved):
    _, tensors = saved
    head = np.random.default_rng(1).normal(size=(64, 32)).astype(np.float32)
    d = _write(tmp_path / "ckpt", {**tensors, "lm_head.weight": head},
               config={**CFG.to_hf(), "tie_word_embeddings": True, "architectures": ["LlamaForCausalLM"]})
    ref_head, ref_emb = _transformers_lm_head(d)
    np.testing.assert_array_equal(ref_head, head)  # transformers uses the file's head, untied
    with pytest.warns(UserWarning, match="tie_word_embeddings: true but the checkpoint's lm_head.weight differs"):
        m = load_model(str(d))
    assert not m.cfg.tie_word_embeddings and m.lm_head is not None
    np.testing.assert_array_equal(np.asarray(m.lm_head.kernel[...]).T, ref_head)
    np.testing.assert_array_equal(np.asarray(m.embed_tokens[...]), ref_emb)
    # a tied model given that checkpoint directly refuses it rather than dropping the head
    tied = nnx.eval_shape(lambda: Decoder(DecoderConfig(**{**CFG.__dict__, "tie_word_embeddings": True}),
                                          rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        load_weights(tied, str(d))


def test_tied_config_with_an_equal_lm_head_stays_tied(tmp_path, saved):
    _, tensors = saved
    d = _write(tmp_path / "ckpt", {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].copy()},
               config={**CFG.to_hf(), "tie_word_embeddings": True, "architectures": ["LlamaForCausalLM"]})
    ref_head, ref_emb = _transformers_lm_head(d)
    m = load_model(str(d))
    assert m.cfg.tie_word_embeddings and m.lm_head is None
    np.testing.assert_array_equal(np.asarray(m.embed_tokens[...]), ref_head)


def test_strict_decides_about_tensors_with_no_place(tmp_path, saved):
    path, tensors = saved
    d = _write(tmp_path / "ckpt", {**tensors, "model.vision_tower.weight": np.ones((4, 4), np.float32),
                                   "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(8, np.float32)})
    with pytest.raises(ValueError, match=r"tensors \['model\.vision_tower\.weight'\] have no place.*strict=False"):
        load_model(str(d))
    m = load_model(str(d), strict=False)
    np.testing.assert_array_equal(m.embed_tokens[...], load_model(str(path)).embed_tokens[...])
    shapes = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0)))
    with pytest.raises(ValueError, match="have no place"):
        load_weights(shapes, str(d))
    load_weights(shapes, str(d), strict=False)
    with pytest.raises(ValueError, match="strict: expected a bool"):
        load_weights(shapes, str(d), strict="no")


# ---------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("change, match", [
    ({"rms_norm_eps": "1e-6"}, r"rms_norm_eps: expected a finite number, got '1e-6'"),
    ({"hidden_size": "32"}, r"hidden_size: expected an integer, got '32'"),
    ({"hidden_size": 32.0}, r"hidden_size: expected an integer, got 32\.0"),
    ({"num_hidden_layers": True}, r"num_hidden_layers: expected an integer, got True"),
    ({"tie_word_embeddings": "false"}, r"tie_word_embeddings: expected true or false"),
    ({"rope_theta": "10000"}, r"rope_theta: expected a finite number"),
    ({"rope_theta": 0}, r"rope_theta must be a finite number > 0"),
    ({"num_key_value_heads": 0}, r"num_key_value_heads must be a positive int, got 0"),
    ({"sliding_window": "4096"}, r"sliding_window: expected an integer"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1, "high_freq_factor": 4,
                       "original_max_position_embeddings": 64}}, r"rope_scaling\.factor: expected a finite number"),
    ({"rope_scaling": "llama3"}, r"rope_scaling: expected an object"),
    ({"hidden_act": None, "vocab_size": None}, r"required field 'vocab_size' is missing"),
])
def test_config_field_errors_name_the_field(tmp_path, change, match):
    (tmp_path / "config.json").write_text(json.dumps({**CFG.to_hf(), **change}))
    with pytest.raises(ValueError, match=match):
        read_config(str(tmp_path))


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads"])
def test_missing_required_fields_are_named(tmp_path, field):
    hf = CFG.to_hf()
    del hf[field]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=f"required field '{field}' is missing"):
        read_config(str(tmp_path))


def test_config_json_that_is_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        read_config(str(tmp_path))


def test_layer_count_checked_before_the_model_is_built(tmp_path, saved):
    _, tensors = saved
    d = _write(tmp_path / "ckpt", tensors, config={**CFG.to_hf(), "num_hidden_layers": 10**6})
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"num_hidden_layers = 1000000 .* holds model\.layers 0-1"):
        load_model(str(d))
    assert time.monotonic() - t0 < 5
    d = _write(tmp_path / "fewer", tensors, config={**CFG.to_hf(), "num_hidden_layers": 1})
    with pytest.raises(ValueError, match=r"num_hidden_layers = 1 .* holds model\.layers 0-1"):
        load_model(str(d))
    gap = {k: v for k, v in tensors.items() if not k.startswith("model.layers.0.")}
    d = _write(tmp_path / "gap", gap)
    with pytest.raises(ValueError, match=r"num_hidden_layers = 2 .* holds model\.layers 1$"):
        load_model(str(d))


# ---------------------------------------------------------------------------------------------------- memory


_RSS_CHILD = textwrap.dedent("""
    import json, resource, sys
    import jax, jax.numpy as jnp
    from jaxspec.models.checkpoint import load_model
    jnp.zeros(1).block_until_ready()
    def vm(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    before = vm("VmRSS")
    base_hwm = vm("VmHWM")
    m = load_model(sys.argv[1])
    jax.block_until_ready(jax.tree.leaves(m))
    print(json.dumps({"before": before, "base_hwm": base_hwm, "hwm": vm("VmHWM"),
                      "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
""")


@pytest.mark.slow
def test_peak_rss_while_loading_stays_within_1_5x_the_checkpoint(tmp_path):
    """A synthetic ~230 MB f32 checkpoint (8 layers, the embedding and head ~9% of it each) loads in a child
    process whose peak RSS grows by at most 1.5x the files' size over its RSS before the load."""
    cfg = DecoderConfig(vocab_size=8192, hidden_size=640, intermediate_size=2560, num_hidden_layers=8,
                        num_attention_heads=10, num_key_value_heads=5, head_dim=64)
    rng = np.random.default_rng(0)
    model = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    from jaxspec.models.checkpoint import hf_tensors

    tensors = {}
    for key, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        parts, transpose = hf_tensors(key, cfg)
        shape = tuple(var.get_value().shape)
        shape = shape[::-1] if transpose else shape
        for name, rows in parts:
            tensors[name] = rng.standard_normal((rows or shape[0], *shape[1:]), np.float32)
    d = tmp_path / "big"
    names = sorted(tensors)
    _write(d, tensors, config=cfg.to_hf(), shards={"a.safetensors": names[::2], "b.safetensors": names[1::2]})
    del tensors
    size = sum(os.path.getsize(d / f) for f in ("a.safetensors", "b.safetensors"))
    assert size >= 200e6
    r = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(d)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    peak = max(got["hwm"], got["maxrss"]) - got["before"]
    print(f"checkpoint {size / 1e6:.0f} MB, RSS before {got['before'] / 1e6:.0f} MB, peak growth {peak / 1e6:.0f} MB "
          f"({peak / size:.2f}x)")
    assert peak <= 1.5 * size, (peak / size, got)

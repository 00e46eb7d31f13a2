"""The draft trainer (``jaxspec.train_draft``) on a tiny random target, CPU: data stage, EAGLE-3 and MTP
training, resume, and the trained EAGLE-3 head driving the engine losslessly with accepted drafts."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.models import Decoder, DecoderConfig, MTPDrafter, load_model, save_model
from jaxspec.models.eagle3 import aux_layers_from_ids, load_eagle3
from jaxspec.models.eagle3_drafter import EAGLE3Drafter
from jaxspec import train_draft as td
from jaxspec.data import self_distill
from jaxspec.models import load_mtp_head

# Every test here compiles the engine and/or a training step on the tiny target: minutes on a 2-core CPU.
pytestmark = pytest.mark.slow

CFG = DecoderConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16)
IDS = (0, 1, 2)  # EAGLE-3 taps: outputs of layers 0, 1, 2 (inputs of 1, 2 and the final pre-norm hidden)
COMMON = ["--user-prefix-ids", "1,2", "--assistant-prefix-ids", "3", "--eot-id", "0", "--device", "cpu",
          "--aux-layer-ids", "0,1,2", "--seed", "3"]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("target"))
    model = Decoder(CFG, rngs=nnx.Rngs(0))
    # A sharper head than the default init: replies mix repeats and varied tokens (tied or unsharpened random
    # targets repeat one token forever, which any draft predicts), mostly a function of the last few tokens.
    model.lm_head.kernel.set_value(model.lm_head.kernel[...] * 3.0)
    save_model(model, path)
    return path


@pytest.fixture(scope="module")
def data_dir(target_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("draft"))
    td.main(["--target", target_dir, "--arch", "eagle3", "--out", out, "--stage", "data", "--num-prompts", "24",
             "--gen-batch", "8", "--prompt-len", "6", "--response-len", "24", *COMMON])
    return out


def test_data_stage_is_the_targets_own_greedy_and_sampled_replies(data_dir, target_dir):
    tokens, lens, rs = self_distill.load_data(os.path.join(data_dir, "data.npz"))
    assert tokens.shape[0] == 24 and (rs > 2).all() and (lens > rs).all()
    assert all(list(tokens[i, :2]) == [1, 2] for i in range(24))  # the user prefix only, then the model's turn
    # Row 0 of each generation batch is greedy: its reply is the target's greedy continuation of its prompt.
    t = load_model(target_dir)
    eng = Engine(t, None, max_context=64, page_size=16, max_batch=1, eos_id=0)
    for i in (0, 8):
        prompt, reply = tokens[i, :rs[i]], tokens[i, rs[i]:lens[i]]
        np.testing.assert_array_equal(eng.generate([prompt], 24).tokens[0], reply)


def test_data_stage_resumes_after_the_last_complete_batch(data_dir, target_dir, tmp_path):
    tokens, lens, rs = self_distill.load_data(os.path.join(data_dir, "data.npz"))
    seqs = [tokens[i, :lens[i]] for i in range(16)]
    packed, l2, r2 = self_distill._pack(seqs, rs[:16])
    self_distill._save_npz(str(tmp_path / "data.npz"), tokens=packed, lens=l2, resp_start=r2)
    td.main(["--target", target_dir, "--arch", "eagle3", "--out", str(tmp_path), "--stage", "data",
             "--num-prompts", "24", "--gen-batch", "8", "--prompt-len", "6", "--response-len", "24", *COMMON])
    t2, l3, r3 = self_distill.load_data(str(tmp_path / "data.npz"))
    np.testing.assert_array_equal(l3, lens)
    np.testing.assert_array_equal(t2[:, :tokens.shape[1]], tokens)


def test_eagle3_training_lowers_the_loss_and_the_head_accepts_drafts_losslessly(data_dir, target_dir):
    td.main(["--target", target_dir, "--arch", "eagle3", "--out", data_dir, "--stage", "train", "--steps", "60",
             "--batch", "16", "--lr", "3e-3", "--draft-vocab", "48", "--ttt-length", "3", "--log-every", "5",
             "--ckpt-every", "30", *COMMON])
    with open(os.path.join(data_dir, "curves.json")) as f:
        curves = json.load(f)
    loss = np.asarray(curves["loss"])
    assert loss.shape[1] == 3 and loss[-1, 0] < 0.7 * loss[0, 0], loss[:, 0]  # soft labels: the floor is the target entropy
    assert np.asarray(curves["accept"])[-1, 0] > 0.5
    head = load_eagle3(os.path.join(data_dir, "eagle3"), kv_dtype=jnp.float32)
    target = load_model(target_dir, aux_layers=aux_layers_from_ids(IDS, 3), kv_dtype=jnp.float32)
    tokens, lens, rs = self_distill.load_data(os.path.join(data_dir, "data.npz"))
    prompts = [tokens[i, :rs[i]] for i in (0, 9, 17)]
    kw = dict(max_context=96, page_size=16, max_batch=4, eos_id=None)
    plain = Engine(target, None, **kw).generate(prompts, 24)
    for spec in (SpecConfig(3, 1, 4), SpecConfig(3, 2, 6)):
        res = Engine(target, EAGLE3Drafter(head, target), spec=spec, **kw).generate(prompts, 24)
        for a, b in zip(res.tokens, plain.tokens):
            np.testing.assert_array_equal(a, b)
        assert res.mean_accept_length > 1.5, (spec, res.mean_accept_length)
    # the replayed accept length (one teacher-forced forward over the greedy replies) is the engine's
    from jaxspec.models.distill_step import distill_step
    from jaxspec.models.replay import replay_accept_length

    chain = Engine(target, EAGLE3Drafter(head, target), spec=SpecConfig(3, 1, 4), **kw).generate(prompts, 24)
    seqs = [np.concatenate([p, np.asarray(r)]) for p, r in zip(prompts, plain.tokens)]
    width = max(len(x) for x in seqs)
    rows = np.stack([np.pad(x, (0, width - len(x))) for x in seqs]).astype(np.int32)
    ds = distill_step(target, head, "eagle3", steps=1, lr=1e-3, ttt_length=3)
    got = replay_accept_length(lambda t: ds.predict(ds.master, ds.frozen, jnp.asarray(t), 3), rows,
                               np.asarray([len(x) for x in seqs]), np.asarray([len(p) for p in prompts]), batch=2)
    assert got["tokens"] == 3 * 23  # every reply token after the prefill's, once
    assert got["row_rounds"] == np.asarray(chain.num_rounds).tolist(), (got, chain.num_rounds)  # round for round
    assert abs(got["accept_length"] - chain.mean_accept_length) < 0.1, (got, chain.mean_accept_length)


def test_mtp_training_lowers_the_loss_and_drives_the_engine(data_dir, target_dir, tmp_path):
    os.link(os.path.join(data_dir, "data.npz"), tmp_path / "data.npz")
    td.main(["--target", target_dir, "--arch", "mtp", "--out", str(tmp_path), "--stage", "train", "--steps", "40",
             "--batch", "16", "--lr", "3e-3", "--mtp-steps", "2", "--log-every", "5", *COMMON])
    with open(tmp_path / "curves.json") as f:
        loss = np.asarray(json.load(f)["loss"])
    assert loss[-1, 0] < 0.7 * loss[0, 0], loss[:, 0]
    model = load_mtp_head(load_model(target_dir, kv_dtype=jnp.float32), str(tmp_path / "mtp"), num_draft_steps=2)
    tokens, lens, rs = self_distill.load_data(str(tmp_path / "data.npz"))
    prompts = [tokens[i, :rs[i]] for i in (0, 9)]
    kw = dict(max_context=96, page_size=16, max_batch=2)
    plain = Engine(model, None, **kw).generate(prompts, 16)
    res = Engine(model, MTPDrafter(model), spec=SpecConfig(2, 1, 3), **kw).generate(prompts, 16)
    for a, b in zip(res.tokens, plain.tokens):
        np.testing.assert_array_equal(a, b)
    assert res.mean_accept_length > 1.2


def test_resume_gives_the_state_of_an_uninterrupted_run(data_dir, target_dir, tmp_path):
    tokens, lens, rs = self_distill.load_data(os.path.join(data_dir, "data.npz"))
    mask = self_distill.response_mask(tokens, lens, rs)
    target = load_model(target_dir, aux_layers=aux_layers_from_ids(IDS, 3))
    kw = dict(arch="eagle3", batch=4, lr=1e-3, draft_vocab=40, ttt_length=2, aux_layer_ids=IDS, seed=1,
              log_every=1, log=lambda *_: None)
    a, ha = td.train(target, tokens, mask, out_dir=str(tmp_path / "a"), steps=4, ckpt_every=100, **kw)
    td.train(target, tokens, mask, out_dir=str(tmp_path / "b"), steps=2, ckpt_every=2, **kw)
    b, hb = td.train(target, tokens, mask, out_dir=str(tmp_path / "b"), steps=4, ckpt_every=100, **kw)
    fa, fb = td._flat(nnx.state(a, nnx.Param)), td._flat(nnx.state(b, nnx.Param))
    assert fa.keys() == fb.keys()
    for k in fa:  # same batches, same optimizer state: the same arithmetic, bit for bit on one machine
        np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)
    assert ha["loss"] == hb["loss"]


@pytest.mark.slow
def test_chatml_ids_of_smollm2():
    """The ChatML user / assistant prefixes and end-of-turn id the data stage gives SmolLM2 (the ids its shipped heads
    were trained with), from the GGUF's own tokenizer."""
    from jaxspec.models.fetch import fetch_model
    from jaxspec.data.self_distill import chatml_ids

    path = str(fetch_model("smollm2-135m-instruct", quiet=True))
    assert chatml_ids(path) == ([1, 4093, 198], [2, 198, 1, 520, 9531, 198], 2)


def test_dev_replay_picks_the_checkpoint_with_the_longest_accept_length(data_dir, target_dir, tmp_path):
    from jaxspec.models.distill_step import distill_step
    from jaxspec.models.replay import replay_accept_length

    tokens, lens, rs = self_distill.load_data(os.path.join(data_dir, "data.npz"))
    mask = self_distill.response_mask(tokens, lens, rs)
    dev = tuple(a[[0, 1, 2, 3, 8, 9]] for a in (tokens, lens, rs))  # the greedy rows of two generation batches
    target = load_model(target_dir, aux_layers=aux_layers_from_ids(IDS, 3))
    logs = []
    head, hist = td.train(target, tokens, mask, arch="eagle3", out_dir=str(tmp_path), steps=30, batch=8, lr=3e-3,
                          draft_vocab=48, ttt_length=3, aux_layer_ids=IDS, seed=2, log_every=10, ckpt_every=15,
                          dev=dev, eval_every=10, eval_steps=3, eval_batch=4, log=logs.append)
    steps = [s for s, _ in hist["replay"]]
    assert steps == [10, 20, 30]
    best = max(hist["replay"], key=lambda r: r[1])
    assert hist["best"] == dict(step=best[0], accept_length=best[1])
    assert any("replayed accept length" in m for m in logs)
    ds = distill_step(target, head, "eagle3", steps=1, lr=1e-3, ttt_length=3)  # the returned head's own weights
    again = replay_accept_length(lambda t: ds.predict(ds.master, ds.frozen, jnp.asarray(t), 3), *dev, batch=4)
    assert again["accept_length"] == pytest.approx(best[1], abs=1e-9)
    with open(tmp_path / "train_state" / "state.json") as f:
        assert json.load(f)["history"]["best"] == hist["best"]

"""The ``seeded`` drafter-data recipe (``jaxspec.data.seeded_chat``), its seeds (``jaxspec.data.chat_seeds``) and
its storage in pieces (``jaxspec.data.shards``)."""

import json
import os

import numpy as np
import pytest

from jaxspec.data import chat_seeds, seeded_chat, shards
from jaxspec.data.self_distill import load_data

ASSETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxspec", "assets", "tiny_pair")
# Seeds the tiny pair's character vocabulary can encode (lower case, no symbols outside it).
TINY_SEEDS = {
    "writing": ((("write about {t}", "a poem on {t}"), ("the sea", "a cat", "rain")),),
    "math": ((("what is {t}", "add {t}"), ("2+2", "3+5")), (("count to ten",), ("",))),
}


# --------------------------------------------------------------------------------------------- seeds
def test_every_kind_is_drawn_and_every_opening_is_complete():
    draws = [chat_seeds.seed_text(0, i) for i in range(4000)]
    kinds = {k for k, _ in draws}
    assert kinds == set(chat_seeds.KINDS) and len(kinds) == 8
    assert all("{t}" not in o and o.strip() for _, o in draws)
    assert chat_seeds.seed_text(0, 7) == chat_seeds.seed_text(0, 7) != chat_seeds.seed_text(1, 7)
    assert chat_seeds.seed_count() == sum(len(set(chat_seeds.openings(k))) for k in chat_seeds.KINDS) > 1000
    every = {o for k in chat_seeds.KINDS for o in chat_seeds.openings(k)}
    assert {o for _, o in draws} <= every


def test_eval_overlap_finds_shared_runs_and_whole_short_questions():
    qs = ["Compose an engaging note about the quiet harbour town at dawn for my readers.", "Name a colour."]
    texts = ["hello", "please compose an ENGAGING note about the quiet harbour town at dawn, thanks",
             "so: name a colour!", "an engaging note about the quiet harbour"]
    assert chat_seeds.eval_overlap(texts, qs) == [(1, 0), (2, 1)]  # text 3 shares only 6 words
    assert chat_seeds.eval_overlap(texts, qs, n=6) == [(1, 0), (2, 1), (3, 0)]
    assert chat_seeds.eval_overlap(texts, []) == []


def test_eval_texts_read_mt_bench_humaneval_and_gsm8k_lines(tmp_path):
    import gzip

    (tmp_path / "mt.jsonl").write_text(json.dumps({"question_id": 1, "turns": ["a b", "c d"]}) + "\n\n")
    with gzip.open(tmp_path / "he.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "x/0", "prompt": "def f():"}) + "\n")
    (tmp_path / "gsm.jsonl").write_text(json.dumps({"question": "How many?", "answer": "4"}) + "\n")
    assert chat_seeds.eval_texts(str(tmp_path / "mt.jsonl")) == ["a b", "c d"]
    assert chat_seeds.eval_texts(str(tmp_path / "he.jsonl.gz")) == ["def f():"]
    assert chat_seeds.eval_texts(str(tmp_path / "gsm.jsonl")) == ["How many?"]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: expected one of the fields"):
        chat_seeds.eval_texts(str(tmp_path / "bad.jsonl"))


@pytest.mark.slow
def test_no_opening_shares_eight_words_with_mt_bench():
    from jaxspec.data import mtbench

    qs = [t for q in mtbench.questions() for t in q["turns"]]
    every = [o for k in chat_seeds.KINDS for o in chat_seeds.openings(k)]
    assert chat_seeds.eval_overlap(every, qs) == []


def test_filter_reasons():
    f = seeded_chat.filter_reason
    assert f("write a poem about an old map", True) is None
    assert f("write a poem about an old map", False) == "unended"
    assert f("hi there", True) == "short"
    assert f("a b c a b c a b c d", True) == "repeats"
    assert f("tell me <|im_start|>assistant about cats", True) == "marker"


# --------------------------------------------------------------------------------------------- shards
def _rows(n, width, rng, top=60000):
    seqs = [rng.integers(0, top, int(rng.integers(2, width))) for _ in range(n)]
    return shards.pack_rows(seqs, [1] * n, [0] * n), seqs


def test_shards_split_at_the_piece_limit_and_read_back(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    monkeypatch.setattr(shards, "MAX_PIECE_BYTES", 4096 + 3000)
    rows, seqs = _rows(40, 300, rng)
    assert rows["tokens"].dtype == np.uint16
    m = shards.add_shard(str(tmp_path), {"recipe": "x"}, rows)
    assert len(m["shards"]) > 1 and m["rows"] == 40 and m["recipe"] == "x"
    assert all(s["bytes"] <= shards.MAX_PIECE_BYTES for s in m["shards"])
    more, seqs2 = _rows(5, 20, rng, top=2**20)  # ids past uint16: int32 shards, read back alike
    assert more["tokens"].dtype == np.int32
    m = shards.add_shard(str(tmp_path), m, more)
    tokens, lens, rs = load_data(str(tmp_path))
    assert tokens.dtype == np.int32 and len(lens) == 45
    for i, s in enumerate(seqs + seqs2):
        np.testing.assert_array_equal(tokens[i, :lens[i]], s)
        assert (tokens[i, lens[i]:] == 0).all()
    assert json.loads((tmp_path / shards.MANIFEST).read_text()) == m


def test_a_changed_or_missing_shard_is_an_error(tmp_path):
    rows, _ = _rows(4, 10, np.random.default_rng(1))
    m = shards.add_shard(str(tmp_path), {}, rows)
    path = tmp_path / m["shards"][0]["file"]
    data = dict(np.load(path))
    data["lens"] = data["lens"] + 0
    data["lens"][0] = 1
    np.savez(path, **data)
    with pytest.raises(ValueError, match="sha256 differs"):
        shards.read_shards(str(tmp_path))
    path.unlink()
    with pytest.raises(ValueError, match="missing"):
        shards.read_shards(str(tmp_path))
    with pytest.raises(ValueError, match="no manifest.json"):
        shards.read_shards(str(tmp_path / "nothing"))


def test_a_row_over_the_piece_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "MAX_PIECE_BYTES", 4096 + 64)
    rows, _ = _rows(2, 2000, np.random.default_rng(2))
    rows["tokens"][:, -1] = 5
    with pytest.raises(ValueError, match="piece limit"):
        shards.add_shard(str(tmp_path), {}, rows)


# --------------------------------------------------------------------------------------------- recipe
@pytest.fixture(scope="module")
def tiny():
    from jaxspec.models import load_model
    from jaxspec.text import Tokenizer

    return load_model(ASSETS), Tokenizer.from_file(ASSETS)


def _make(tiny, out, n=10, **kw):
    target, tok = tiny
    args = dict(num_prompts=n, prompt_len=12, response_len=10, gen_batch=8, eot_id=1, seed=3,
                categories=TINY_SEEDS, min_words=1, log=lambda msg: None)
    args.update(kw)
    return seeded_chat.generate_seeded_data(target, tok, str(out), **args)


@pytest.mark.slow
def test_seeded_data_is_the_chat_template_and_the_targets_replies(tiny, tmp_path):
    from jaxspec.engine import Engine

    target, tok = tiny
    m = _make(tiny, tmp_path / "d")
    assert m["rows"] == 10 and m["recipe"] == "seeded" and m["kinds"] == ["writing", "math"]
    assert sum(m["kept"].values()) == 10 and m["next_index"] % 8 == 0
    assert "Apache-2.0" in m["licence"] and "chat_seeds" in m["source"]
    tokens, lens, rs = load_data(str(tmp_path / "d"))
    assert tokens.shape[0] == 10 and (lens > rs).all()
    eng = Engine(target, None, max_context=128, page_size=16, max_batch=1, eos_id=1)
    first_of_batch = {0, m["shards"][0]["rows"]}
    for i in range(10):
        prompt = tokens[i, :rs[i]].tolist()
        text = tok.decode(prompt)
        assert text.startswith("user: ") and text.endswith("\nassistant: ")
        content = text[len("user: "):-len("\nassistant: ")]
        assert prompt == tok.encode_chat([{"role": "user", "content": content}])  # the template users use
        assert any(content.startswith(o) for k in TINY_SEEDS for o in chat_seeds.openings(k, TINY_SEEDS))
        if i in first_of_batch:  # each batch's first rows are answered greedily
            np.testing.assert_array_equal(eng.generate([np.asarray(prompt, np.int32)], 10).tokens[0],
                                          tokens[i, rs[i]:lens[i]])


@pytest.mark.slow
def test_seeded_data_resumes_refuses_other_arguments_and_drops_eval_overlaps(tiny, tmp_path, monkeypatch):
    whole = _make(tiny, tmp_path / "a", n=12)
    assert len(whole["shards"]) >= 2
    add = shards.add_shard

    def crash_after_one(folder, manifest, rows):
        if manifest["shards"]:
            raise KeyboardInterrupt  # the run stops while its second batch is written
        return add(folder, manifest, rows)

    monkeypatch.setattr(shards, "add_shard", crash_after_one)
    with pytest.raises(KeyboardInterrupt):
        _make(tiny, tmp_path / "b", n=12)
    monkeypatch.setattr(shards, "add_shard", add)
    assert shards.read_manifest(str(tmp_path / "b"))["rows"] < 12
    resumed = _make(tiny, tmp_path / "b", n=12)
    assert resumed["rows"] == 12 and resumed["shards"] == whole["shards"]
    for x, y in zip(load_data(str(tmp_path / "a")), load_data(str(tmp_path / "b"))):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="manifest's args"):
        _make(tiny, tmp_path / "b", n=12, response_len=9)
    # an evaluation question equal to a kept user turn: that turn is dropped from a fresh folder
    target, tok = tiny
    tokens, lens, rs = load_data(str(tmp_path / "a"))
    text = tok.decode(tokens[0, :rs[0]].tolist())[len("user: "):-len("\nassistant: ")]
    checked = _make(tiny, tmp_path / "c", n=12, eval_questions=[text])
    assert checked["dropped"].get("eval_overlap", 0) >= 1 and checked["eval_check"]["questions"] == 1
    t2, l2, r2 = load_data(str(tmp_path / "c"))
    kept = [tok.decode(t2[i, :r2[i]].tolist())[len("user: "):-len("\nassistant: ")] for i in range(len(l2))]
    assert chat_seeds.eval_overlap(kept, [text]) == []


@pytest.mark.slow
def test_train_draft_cli_writes_the_seeded_recipe_for_smollm2(tmp_path):
    from jaxspec import train_draft as td
    from jaxspec.data import mtbench
    from jaxspec.models.fetch import fetch_model
    from jaxspec.text import Tokenizer

    gguf = str(fetch_model("smollm2-135m-instruct", quiet=True))
    qpath = str(mtbench.fetch_questions(quiet=True))
    out = tmp_path / "run"
    td.main(["--target", gguf, "--arch", "eagle3", "--out", str(out), "--stage", "data", "--recipe", "seeded",
             "--num-prompts", "4", "--gen-batch", "4", "--prompt-len", "24", "--response-len", "8", "--device", "cpu",
             "--eval-questions", qpath])
    m = shards.read_manifest(str(out / "data"))
    assert m["rows"] == 4 and m["eval_check"]["questions"] == 160 and m["args"]["greedy_fraction"] == 0.8
    tokens, lens, rs = load_data(td.data_path(str(out), "seeded"))
    tok = Tokenizer.from_file(gguf)
    system = tok.apply_chat_template([{"role": "user", "content": "x"}]).split("x")[0]
    for i in range(4):
        assert tok.decode(tokens[i, :rs[i]].tolist()).startswith(system)  # the default system turn users get

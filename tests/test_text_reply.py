"""jaxspec.text.Reply (one reply's text out of its token ids) against a reference that decodes whole id lists,
and jaxspec.text.reply_budget (a prompt and reply against the context).

The reference: the reply ends at the first stop token at a position >= min_tokens (that token counted), or at
the first token k >= min_tokens after which a stop string ends past the text shown before it -- the text shown
after k tokens being the decode of the longest prefix of them not ending mid-character (the left-out stop
tokens left out) -- or, failing both, at the last token (where a stop string may still complete in the decode
of all the ids). A byte-level BPE vocabulary of few merges
splits multi-byte characters across tokens, so stop strings and characters straddle token boundaries.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

from jaxspec.text import LimitError, Reply, ReplyDelta, Tokenizer, reply_budget
from jaxspec.text.char_vocab import char_tokenizer
from jaxspec.text.tokenizer import bytes_to_unicode

CORPUS = ["the cat sat on the mat. ", "héllo wörld 🤗 日本語 ", "12 34 56 ", "stop STOP end\n"] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _backend():
    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=290, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


TOK = Tokenizer(_backend(), special_tokens={"eos_token": "<|im_end|>"})
V = TOK.vocab_size
SPECIAL_IDS = [TOK.token_to_id(s) for s in SPECIALS]
BYTE_CHARS = bytes_to_unicode()  # byte -> its character in the byte-level alphabet (GPT-2's table)
WORDS = ["the", " cat", "é", "ö", "🤗", "日本", " 3", "\n", "STOP", " e"]  # multi-byte characters among them


def _visible(ids, skip) -> str:
    """The text a stream shows after ``ids``: the decode of the longest prefix not ending mid-character."""
    for r in range(len(ids), 0, -1):
        t = TOK.decode(ids[:r], skip_special_tokens=skip)
        if not t.endswith("\ufffd"):
            return t
    return ""


def _cut(before, text, stops, keep):
    """``text`` up to the first stop string completed past ``before`` (the text shown until then; of two at one
    place the shorter), or None: none is."""
    hits = [(at, len(s)) for s in stops if (at := text.find(s, max(0, len(before) - len(s) + 1))) >= 0]
    if not hits:
        return None
    at, n = min(hits)
    return text[: at + (n if keep else 0)]


def reference(ids, *, stop_ids=(), stops=(), keep=False, skip=True, min_tokens=0, finish="length"):
    """``(text, token_ids, finish_reason)`` from whole decodes (module docstring)."""
    silent = set() if keep else set(stop_ids)
    end = next((j + 1 for j, t in enumerate(ids) if t in stop_ids and j >= min_tokens), None)
    taken = ids if end is None else ids[:end]
    shown = [_visible([i for i in taken[:k] if i not in silent], skip) for k in range(len(taken) + 1)]
    for k in range(max(1, min_tokens), len(taken) + 1):
        text = _cut(shown[k - 1], shown[k], stops, keep)
        if text is not None:
            return text, ids[:k], "stop"
    full = TOK.decode([i for i in taken if i not in silent], skip_special_tokens=skip)
    text = _cut(shown[-1], full, stops, keep) if len(taken) >= min_tokens else None
    return (full if text is None else text), taken, ("stop" if end is not None or text is not None else finish)


def _run(ids, chunks, **kw):
    """Push ``ids`` in pieces of the sizes ``chunks`` (the last push ends the reply); every delta checked."""
    reply = Reply(TOK, **kw)
    got_text, got_ids, pos = "", [], 0
    sizes = list(chunks)
    while reply.finish_reason is None:
        n = sizes.pop(0) if sizes else len(ids) - pos
        piece, pos = ids[pos: pos + n], pos + n
        d = reply.push(piece, "length" if pos >= len(ids) else None)
        assert isinstance(d, ReplyDelta)
        got_text += d.text
        got_ids += d.token_ids
        assert reply.text.startswith(got_text)  # what went out is never taken back
        assert d.token_ids == piece[: len(d.token_ids)]
    assert (got_text, got_ids) == (reply.text, reply.token_ids)
    return reply.text, reply.token_ids, reply.finish_reason


ID_LISTS = st.lists(st.one_of(st.integers(0, V - 1), st.sampled_from(SPECIAL_IDS)), min_size=1, max_size=24)
CHUNKS = st.lists(st.integers(1, 6), max_size=12)


@settings(max_examples=200, deadline=None)
@given(ID_LISTS, CHUNKS, st.booleans())
def test_no_stops_is_the_whole_decode(ids, chunks, skip):
    """Pushed in any pieces, the text is the decode of all the ids, and every id is taken."""
    assert _run(ids, chunks, skip_special_tokens=skip) == (TOK.decode(ids, skip_special_tokens=skip), ids, "length")


@settings(max_examples=200, deadline=None)
@given(ID_LISTS, CHUNKS, st.lists(st.integers(0, V - 1), max_size=3), st.integers(0, 8), st.booleans(),
       st.booleans())
def test_stop_tokens_and_min_tokens(ids, chunks, stop_ids, min_tokens, keep, skip):
    """The first stop token from position ``min_tokens`` on ends the reply (counted); earlier ones stay in the
    ids, their text (as the ending one's) left out unless ``include_stop_str_in_output``."""
    stop_ids = stop_ids + [ids[len(ids) // 2]]  # one that occurs
    kw = dict(stop_ids=stop_ids, keep=keep, skip=skip, min_tokens=min_tokens)
    assert _run(ids, chunks, stop_token_ids=stop_ids, include_stop_str_in_output=keep, skip_special_tokens=skip,
                min_tokens=min_tokens) == reference(ids, **kw)


@st.composite
def with_stop_strings(draw):
    """Ids, and stop strings of which most occur in their text (picked out of it, often across tokens)."""
    ids = draw(st.lists(st.one_of(st.sampled_from([TOK.encode(w, add_special_tokens=False)[0] for w in WORDS]),
                                  st.integers(0, V - 1)), min_size=1, max_size=20))
    text = TOK.decode(ids, skip_special_tokens=True).replace("\ufffd", "")
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        if text and draw(st.booleans()):
            a = draw(st.integers(0, len(text) - 1))
            stops.append(text[a: a + draw(st.integers(1, 4))])
        else:
            stops.append(draw(st.sampled_from(WORDS)))
    return ids, stops


@settings(max_examples=300, deadline=None)
@given(with_stop_strings(), CHUNKS, st.lists(st.integers(0, V - 1), max_size=2), st.booleans(), st.booleans(),
       st.one_of(st.just(0), st.integers(0, 8)), st.one_of(st.none(), st.integers(0, 30)))
def test_stop_strings_end_text_and_ids_together(case, chunks, stop_ids, keep, skip, min_tokens, at):
    """A stop string ends the text before it (or with it) and the ids at the token that completed it; the
    streamed text never shows what a stop string could still take back; with stop tokens and min_tokens."""
    ids, stops = case
    stop_ids = stop_ids + ([] if at is None else [ids[at % len(ids)]])  # one that occurs
    want = reference(ids, stop_ids=stop_ids, stops=stops, keep=keep, skip=skip, min_tokens=min_tokens)
    got = _run(ids, chunks, stop_token_ids=stop_ids, stop=stops, include_stop_str_in_output=keep,
               skip_special_tokens=skip, min_tokens=min_tokens)
    assert got == want
    if not keep and min_tokens == 0 and got[2] == "stop" and not (got[1] and got[1][-1] in stop_ids):
        assert not any(s in got[0] for s in stops)


def test_a_stop_string_across_tokens_and_characters():
    """Worked cases: a stop string completed by a later token than the one it starts in; a multi-byte character
    split over two tokens, shown whole once its last byte has come; the text held back by the longest stop."""
    ids = TOK.encode("the cat sat", add_special_tokens=False)
    assert len(ids) > 3
    r = Reply(TOK, stop=["t s", "zzzz"])
    shown = "".join(r.push([i]).text for i in ids[:-1])
    assert r.finish_reason is None and "t s" not in shown
    d = r.push(ids[-1:], "length")
    assert (r.text, d.finish_reason, r.stop_reason) == ("the ca", "stop", "t s")
    assert TOK.decode(r.token_ids).find("t s") >= 0 and "t s" not in TOK.decode(r.token_ids[:-1])
    # a character of four bytes over single-byte tokens
    raw = "🤗".encode()
    byte_ids = [TOK.token_to_id(BYTE_CHARS[b]) for b in raw]
    assert TOK.decode(byte_ids) == "🤗" and all(i is not None for i in byte_ids)
    r = Reply(TOK)
    assert [r.push([i]).text for i in byte_ids[:3]] == ["", "", ""]
    assert r.push(byte_ids[3:]).text == "🤗"
    r = Reply(TOK, stop=["🤗"], include_stop_str_in_output=True)
    assert [r.push([i]).finish_reason for i in byte_ids] == [None, None, None, "stop"]
    assert (r.text, r.token_ids) == ("🤗", byte_ids)
    r = Reply(TOK, stop=["zzzz"])  # three characters held back while "zzzz" could still begin
    assert r.push(TOK.encode("abcdef", add_special_tokens=False)).text == "abc"
    assert r.push([], "length").text == "def"


def test_min_tokens_with_stop_strings():
    """Stop strings are looked for once ``min_tokens`` tokens have come, in the text those tokens added."""
    ids = TOK.encode("stop stop end", add_special_tokens=False)
    first = next(k for k in range(1, len(ids) + 1) if "stop" in TOK.decode(ids[:k]))
    r = Reply(TOK, stop=["stop"])
    r.push(ids, "length")
    assert (r.text, r.token_ids) == ("", ids[:first])
    r = Reply(TOK, stop=["stop"], min_tokens=first + 1)
    r.push(ids, "length")
    second = next(k for k in range(first + 1, len(ids) + 1) if TOK.decode(ids[:k]).count("stop") == 2)
    assert (r.text, r.token_ids, r.finish_reason) == ("stop ", ids[:second], "stop")


def test_finish_reasons_and_stop_reason():
    """The reason given to ``push`` ends the reply unless a stop came first; ``stop_reason`` names the stop."""
    eot = TOK.token_to_id("<|im_end|>")
    ids = TOK.encode("the cat", add_special_tokens=False)
    r = Reply(TOK, stop_token_ids=[eot])
    d = r.push(ids + [eot] + ids, "length")
    assert (d.text, d.token_ids, d.finish_reason, r.stop_reason) == ("the cat", ids + [eot], "stop", eot)
    r = Reply(TOK, stop_token_ids=[eot], include_stop_str_in_output=True, skip_special_tokens=False)
    assert r.push(ids + [eot]).text == "the cat<|im_end|>"
    r = Reply(TOK)
    assert r.push(ids).finish_reason is None
    assert r.push([], "abort") == ReplyDelta("", [], "abort") and r.stop_reason is None
    with pytest.raises(ValueError, match="ids: the reply has ended"):
        r.push([1])
    r = Reply(TOK)
    assert r.push(np.array(ids, np.int32)).token_ids == ids  # numpy ids are ids


def test_another_vocabulary():
    """The character vocabulary of the tiny pairs (a WordLevel model, a Fuse decoder)."""
    tok = char_tokenizer()
    ids = tok.encode("ab ab cab", add_special_tokens=False)
    r = Reply(tok, stop=["b c"], include_stop_str_in_output=True)
    pieces = [r.push([i]).text for i in ids[:7]]
    assert r.finish_reason == "stop" and "".join(pieces) == r.text == "ab ab c" and r.token_ids == ids[:7]


@pytest.mark.parametrize("kw, match", [
    ({"stop": "x"}, "stop: expected a sequence of non-empty strings"),
    ({"stop": ["x", ""]}, "stop: expected a sequence of non-empty strings"),
    ({"min_tokens": -1}, "min_tokens: expected an int >= 0"),
    ({"min_tokens": True}, "min_tokens: expected an int >= 0"),
    ({"stop_token_ids": "ab"}, "stop_token_ids: expected a sequence of token ids"),
    ({"stop_token_ids": [1.5]}, "stop_token_ids: expected integer token ids"),
])
def test_reply_refusals_name_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        Reply(TOK, **kw)


def test_push_refusals_name_the_argument():
    with pytest.raises(ValueError, match="tokenizer: expected a jaxspec.text.Tokenizer"):
        Reply(TOK.backend)
    r = Reply(TOK)
    with pytest.raises(ValueError, match="ids: expected integer token ids"):
        r.push(["a"])
    with pytest.raises(ValueError, match="ids: expected a sequence of token ids"):
        r.push(3)
    with pytest.raises(ValueError, match="finish_reason: expected a non-empty str"):
        r.push([1], "")
    with pytest.raises(ValueError, match=r"ids: \d+ is not a token id"):
        r.push([V])


# ----------------------------------------------------------------------------------------------- reply_budget
def test_reply_budget():
    """``prompt + reply + reserved <= context``; the default is all the room left, or ``default`` within it."""
    assert reply_budget(10, None, max_context=64, reserved=4) == 50
    assert reply_budget(10, None, max_context=64, reserved=4, default=16) == 16
    assert reply_budget(50, None, max_context=64, reserved=4, default=16) == 10
    assert reply_budget(10, 50, max_context=64, reserved=4) == 50
    assert reply_budget(59, np.int64(1), max_context=64, reserved=4) == 1
    for mnt in (51, 0, 2.5, True, "3"):
        with pytest.raises(LimitError, match=r"max_new_tokens: expected an int in \[1, 50\]") as e:
            reply_budget(10, mnt, max_context=64, reserved=4)
        assert e.value.param == "max_new_tokens"
    with pytest.raises(LimitError, match="max_tokens: expected") as e:
        reply_budget(10, 99, max_context=64, max_new_tokens_name="max_tokens")
    assert e.value.param == "max_tokens"
    for n in (60, 64, 1000):
        with pytest.raises(LimitError, match="messages: the prompt is .* no room for a reply") as e:
            reply_budget(n, 1, max_context=64, reserved=4, prompt_name="messages")
        assert e.value.param == "messages"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.one_of(st.none(), st.integers(-5, 300)), st.integers(1, 256), st.integers(0, 8),
       st.one_of(st.none(), st.integers(1, 64)))
def test_reply_budget_is_the_context_rule(n, mnt, ctx, reserved, default):
    room = ctx - reserved - n
    if room < 1:
        with pytest.raises(LimitError) as e:
            reply_budget(n, mnt, max_context=ctx, reserved=reserved, default=default)
        assert e.value.param == "prompt"
    elif mnt is not None and not 1 <= mnt <= room:
        with pytest.raises(LimitError) as e:
            reply_budget(n, mnt, max_context=ctx, reserved=reserved, default=default)
        assert e.value.param == "max_new_tokens"
    else:
        got = reply_budget(n, mnt, max_context=ctx, reserved=reserved, default=default)
        assert got == (mnt if mnt is not None else room if default is None else min(default, room))
        assert 1 <= got and n + got + reserved <= ctx

"""``jaxspec.models.replay``: chain rounds from per-step hits, on hand-made cases (the engine comparison is in
``tests/test_train_draft.py``, on a trained head)."""

import numpy as np
import pytest

from jaxspec.models import replay


def test_rounds_walk_the_reply_by_the_accepted_prefix_plus_one():
    hits = np.zeros((3, 12), bool)
    # bonus at 2 (row 1): steps 0, 1 hit -> 3 tokens, bonus at 5 (row 4): nothing -> 1 token, bonus at 6 (row 5):
    # all three -> 4 tokens, bonus at 10 (row 9): the reply ends at 11 -> 1 token
    hits[0, 1] = hits[1, 1] = True
    hits[2, 1] = False
    hits[:, 5] = True
    hits[0, 9] = hits[1, 9] = True  # would predict 11 and 12: only 11 lies in the reply
    assert replay.chain_rounds(hits, 2, 12) == (4, 9)
    assert replay.chain_rounds(hits, 2, 3) == (0, 0)  # the prefill's token is the whole reply


def test_step_hits_compare_each_step_with_its_own_offset():
    tokens = np.asarray([[5, 6, 7, 8, 9, 4]])
    pred = np.zeros((1, 2, 6), np.int32)
    pred[0, 0] = [7, 0, 9, 0, 0, 0]  # step 0 at row t predicts t + 2
    pred[0, 1] = [8, 9, 0, 0, 0, 0]  # step 1 predicts t + 3
    hits = replay.step_hits(pred, tokens)
    assert hits[0, 0].tolist() == [True, False, True, False, False, False]
    assert hits[0, 1].tolist() == [True, True, False, False, False, False]


def test_replay_pads_the_last_batch_and_sums_over_rows():
    tokens = np.tile(np.arange(10, dtype=np.int32), (3, 1))
    calls = []

    def predict(rows):
        calls.append(rows.shape)
        return np.stack([np.pad(rows[:, 2 + k:], ((0, 0), (0, 2 + k))) for k in range(2)], axis=1)  # always right

    got = replay.replay_accept_length(predict, tokens, np.asarray([10, 10, 6]), np.asarray([2, 4, 2]), batch=2)
    assert calls == [(2, 10), (2, 10)]
    # perfect drafts, chain of 2: 3 tokens a round until the end
    assert got["row_rounds"] == [3, 2, 1] and got["tokens"] == 7 + 5 + 3
    assert got["accept_length"] == 15 / 6


def test_shorter_chains_replay_from_the_same_forward():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 5, (5, 40)).astype(np.int32)
    pred = np.stack([np.pad(tokens[:, 2 + k:], ((0, 0), (0, 2 + k))) for k in range(4)], axis=1)
    pred = np.where(rng.random(pred.shape) < 0.3, 9, pred)  # 30% of the drafts wrong
    lens, rs = np.full(5, 40), np.full(5, 3)
    full = replay.replay_accept_length(lambda r: pred[:len(r)] if len(r) == 5 else None, tokens, lens, rs, batch=5,
                                       depths=[1, 2, 4])
    for d in (1, 2, 4):
        alone = replay.replay_accept_length(lambda r, d=d: pred[:, :d], tokens, lens, rs, batch=5)
        assert full["by_depth"][d] == alone["accept_length"]
    assert full["by_depth"][4] == full["accept_length"]
    assert 1 <= full["by_depth"][1] <= min(full["by_depth"][2], full["by_depth"][4]) and full["by_depth"][4] <= 5
    with pytest.raises(ValueError, match="depths"):
        replay.replay_accept_length(lambda r: pred, tokens, lens, rs, batch=5, depths=[5])

"""One reply's text as its token ids arrive: ``Reply`` (detokenizing, stop tokens, stop strings) and the
``ReplyDelta`` each ``push`` returns.

A reply ends at the first of:

* a stop token (one of ``stop_token_ids``) at output position ``>= min_tokens``: the token belongs to the
  reply (it is in ``token_ids``) but its text does not, unless ``include_stop_str_in_output``. A stop token
  before ``min_tokens`` does not end it; its text is left out all the same;
* a stop string, looked for once at least ``min_tokens`` tokens have come: the text ends before it (with it,
  given ``include_stop_str_in_output``) and the ids end at the token that completed it (the ids after it
  are dropped, as is the text the token added past the stop string);
* the end of the ids (``push(..., finish_reason=...)``: e.g. ``"length"`` at ``max_new_tokens``).

The text is decoded incrementally (``IncrementalDetokenizer``: whole UTF-8 characters only; the text of the
ids that are not left out). While stop strings may still match, ``push`` holds back the text's last
``len(longest stop string) - 1`` characters, which could be the start of one. The deltas concatenate to
``text``; their ids to ``token_ids``.
"""

import numbers
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from jaxspec.text.tokenizer import IncrementalDetokenizer, Tokenizer


class ReplyDelta(NamedTuple):
    """What one ``Reply.push`` added: ``text`` now final, the ``token_ids`` now part of the reply, and the
    ``finish_reason`` (``"stop"``, or the one given to ``push``) once the reply has ended, else None."""

    text: str
    token_ids: list
    finish_reason: str | None


def _ids(name: str, ids) -> list[int]:
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise ValueError(f"{name}: expected a sequence of token ids, got {ids!r}")
    out = list(ids)
    if not all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in out):
        raise ValueError(f"{name}: expected integer token ids, got {out!r}")
    return [int(i) for i in out]


class Reply:
    """The text of one reply, built from its token ids (see the module docstring).

    Args:
      tokenizer: the ``Tokenizer`` the ids belong to.
      stop_token_ids: ids that end the reply (from output position ``min_tokens`` on).
      stop: stop strings (non-empty); the first one found ends the reply.
      include_stop_str_in_output: keep the stop string, or the stop token's text, in the text.
      skip_special_tokens: leave special tokens' text out.
      min_tokens: stop tokens and stop strings end the reply only from this many tokens on (an int >= 0).
    """

    def __init__(self, tokenizer: Tokenizer, *, stop_token_ids: Sequence[int] = (), stop: Sequence[str] = (),
                 include_stop_str_in_output: bool = False, skip_special_tokens: bool = True, min_tokens: int = 0):
        if not isinstance(tokenizer, Tokenizer):
            raise ValueError(f"tokenizer: expected a jaxspec.text.Tokenizer, got {type(tokenizer).__name__}")
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop: expected a sequence of non-empty strings, got {stop!r}")
        if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
            raise ValueError(f"min_tokens: expected an int >= 0, got {min_tokens!r}")
        self.stop_token_ids = frozenset(_ids("stop_token_ids", stop_token_ids))
        self.stop = tuple(stop)
        self.include_stop_str_in_output = bool(include_stop_str_in_output)
        self.min_tokens = min_tokens
        self._vocab_size = tokenizer.vocab_size
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=bool(skip_special_tokens))
        self._silent = frozenset() if self.include_stop_str_in_output else self.stop_token_ids
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""  # the reply's text so far (with what ``push`` still holds back)
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None  # the stop token id or stop string that ended it
        self._sent = 0  # characters of ``text`` returned in deltas

    def push(self, ids: Iterable[int], finish_reason: str | None = None) -> ReplyDelta:
        """Take the next token ids of the reply.

        Args:
          ids: the ids that followed the ones pushed before (those past the reply's end are not taken).
          finish_reason: given when no ids follow these (e.g. ``"length"``): the reply ends with it, unless a
            stop token or stop string in ``ids`` ended it first (``"stop"``).

        Returns:
          the ``ReplyDelta``: the text newly final, the ids newly taken, the finish reason once it ended.
        """
        if self.finish_reason is not None:
            raise ValueError(f"ids: the reply has ended ({self.finish_reason!r}); it takes no more")
        if finish_reason is not None and (not isinstance(finish_reason, str) or not finish_reason):
            raise ValueError(f"finish_reason: expected a non-empty str or None, got {finish_reason!r}")
        ids = _ids("ids", ids)
        bad = next((i for i in ids if not 0 <= i < self._vocab_size), None)
        if bad is not None:
            raise ValueError(f"ids: {bad} is not a token id in [0, {self._vocab_size})")
        start = len(self.token_ids)
        if self.stop:
            for i in ids:
                self.token_ids.append(i)
                if i not in self._silent:
                    self._extend(self._detok.push([i]))
                if self.stop_reason is None and i in self.stop_token_ids and len(self.token_ids) > self.min_tokens:
                    self.stop_reason = i
                if self.stop_reason is not None:
                    break
        else:
            first = max(0, self.min_tokens - start)  # stop ids count from output position min_tokens
            end = next((k for k, t in enumerate(ids) if k >= first and t in self.stop_token_ids), None)
            if end is not None:
                ids, self.stop_reason = ids[: end + 1], ids[end]
            self.token_ids += ids
            self.text += self._detok.push([i for i in ids if i not in self._silent] if self._silent else ids)
        if finish_reason is not None or self.stop_reason is not None:
            if not isinstance(self.stop_reason, str):  # a stop string ended the text where it was found
                self._extend(self._detok.finish())  # which may complete a stop string
            self.finish_reason = "stop" if self.stop_reason is not None else finish_reason
        hold = 0 if self.finish_reason is not None else self._hold
        end = max(self._sent, len(self.text) - hold)
        piece, self._sent = self.text[self._sent: end], end
        return ReplyDelta(piece, self.token_ids[start:], self.finish_reason)

    def _extend(self, piece: str) -> None:
        """Append ``piece`` to the text; with stop strings, cut at the first one that ends in it."""
        before = len(self.text)
        self.text += piece
        if not piece or not self.stop or len(self.token_ids) < self.min_tokens:
            return
        hits = [(at, len(s), s) for s in self.stop if (at := self.text.find(s, max(0, before - len(s) + 1))) >= 0]
        if hits:
            at, n, s = min(hits)
            self.text = self.text[: at + (n if self.include_stop_str_in_output else 0)]
            self.stop_reason = s

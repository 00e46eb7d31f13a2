"""``MockVocab``: a deterministic character-level tokenizer (nothing is downloaded)."""

import dataclasses

import numpy as np

PAD = "\x00"  # id 0: padding (never produced by the corpus)
EOS = "\n"  # id 1: end of line / end of sequence

# Printable characters of the tiny corpus (jaxspec/corpus.py); lowercase prose, digits, a few signs.
_CHARS = PAD + EOS + " abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'-+=()"


@dataclasses.dataclass(frozen=True)
class MockVocab:
    """Char tokenizer: ids are positions in ``chars``; unknown characters raise ``ValueError``."""

    chars: str = _CHARS
    vocab_size: int = 64

    def __post_init__(self):
        if len(set(self.chars)) != len(self.chars):
            raise ValueError("MockVocab.chars must be unique")
        if len(self.chars) > self.vocab_size:
            raise ValueError(f"MockVocab: {len(self.chars)} chars do not fit vocab_size={self.vocab_size}")

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def eos_id(self) -> int:
        return 1

    def encode(self, text: str) -> np.ndarray:
        table = {c: i for i, c in enumerate(self.chars)}
        try:
            return np.asarray([table[c] for c in text], np.int32)
        except KeyError as e:
            raise ValueError(f"MockVocab.encode: character {e.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] if 0 <= int(i) < len(self.chars) else "?" for i in ids)

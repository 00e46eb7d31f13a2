"""jaxspec.text: the text layer beside the models -- tokenizers (``tokenizer.json`` or a GGUF's own
vocabulary), chat templates rendered as transformers renders them, the checkpoint's stop tokens, streaming
detokenization, one reply's text out of its token ids (``Reply``: stop tokens, stop strings), the length
check of a prompt and reply against a context (``reply_budget``), and text-in/text-out generation over
``jaxspec.engine.Engine``.

The engine and the speculative round deal in token ids and never import this package."""

from jaxspec.text.chat import ChatTemplateError as ChatTemplateError
from jaxspec.text.chat import render_chat_template as render_chat_template
from jaxspec.text.limits import LimitError as LimitError
from jaxspec.text.limits import reply_budget as reply_budget
from jaxspec.text.reply import Reply as Reply
from jaxspec.text.reply import ReplyDelta as ReplyDelta
from jaxspec.text.tokenizer import IncrementalDetokenizer as IncrementalDetokenizer
from jaxspec.text.tokenizer import Tokenizer as Tokenizer
from jaxspec.text.generate import TextGenerator as TextGenerator
from jaxspec.text.generate import TextOutput as TextOutput
from jaxspec.text.generate import load_chat_model as load_chat_model

"""How long a reply may be: ``reply_budget``, the prompt and ``max_new_tokens`` checked against the context
(``prompt + max_new_tokens + reserved <= max_context``, as the engine requires), and ``LimitError``, its
refusal naming the argument."""

import numbers


class LimitError(ValueError):
    """A prompt or reply length over the context: ``message``, and ``param``, the name of the argument at
    fault (the prompt's or ``max_new_tokens``'s, as the caller named them)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


def reply_budget(num_prompt_tokens: int, max_new_tokens: int | None, *, max_context: int, reserved: int = 0,
                 default: int | None = None, prompt_name: str = "prompt",
                 max_new_tokens_name: str = "max_new_tokens") -> int:
    """The number of tokens a reply to a prompt may take.

    Args:
      num_prompt_tokens: the prompt's length in tokens.
      max_new_tokens: the reply's limit asked for, or None (then ``default``, at most the room left).
      max_context: the tokens a request may hold in all.
      reserved: tokens of the context that are neither prompt nor reply (e.g. the engine's verify width).
      default: the limit when ``max_new_tokens`` is None (None: all the room the prompt leaves).
      prompt_name / max_new_tokens_name: the arguments' names, as the caller's errors should give them.

    Returns:
      ``max_new_tokens`` (or its default): an int in ``[1, max_context - reserved - num_prompt_tokens]``.

    Raises:
      LimitError: the prompt leaves no room for a reply (``param``: ``prompt_name``), or ``max_new_tokens``
        is not an int in that range (``param``: ``max_new_tokens_name``).
    """
    room = max_context - reserved - num_prompt_tokens
    if room < 1:
        raise LimitError(f"{prompt_name}: the prompt is {num_prompt_tokens} tokens; the context is {max_context} "
                         f"tokens ({reserved} reserved), which leaves no room for a reply", prompt_name)
    if max_new_tokens is None:
        return room if default is None else min(default, room)
    if not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool) \
            or not 1 <= max_new_tokens <= room:
        raise LimitError(f"{max_new_tokens_name}: expected an int in [1, {room}] (the context left after the "
                         f"{num_prompt_tokens}-token prompt), got {max_new_tokens!r}", max_new_tokens_name)
    return int(max_new_tokens)

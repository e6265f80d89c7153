"""Incremental detokenization of one sequence, and its stop strings.

Each step decodes only a short window of recent tokens (vLLM's prefix_offset/read_offset method): the window
starts with tokens already turned into text, which give the new tokens their context (a leading space,
a byte-level merge), and the new text is what the window's text gained. Text that ends in U+FFFD may be half
of a UTF-8 character split over tokens, so it is held back until the next token completes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from argosy.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from argosy.engine.tokenizer import Tokenizer

_PROMPT_CONTEXT = 5  # prompt tokens decoded as context for the first output token, as vLLM does
# A run of invalid bytes never completes. Past this many tokens without a whole character (a real one spans at
# most 4), release all but the last 3 U+FFFD (as many as a partial character can produce) and slide the window
# anyway, so that a model emitting garbage still costs O(1) per token.
_MAX_PENDING_TOKENS = 8
_MAX_PARTIAL_CHARS = 3


def _trailing_replacements(text: str) -> int:
    # ByteFallback decoders replace a whole run of byte tokens with one U+FFFD per byte while it is not valid
    # UTF-8, so a partial character can turn more than its own bytes into U+FFFD: hold the whole run back.
    return len(text) - len(text.rstrip("\ufffd"))


class IncrementalDetokenizer:
    """The text of one sequence, token by token.

    `update(tokens)` extends `output_text` and returns a matched stop string (the sequence must stop) or None;
    `get_delta()` streams the new text, holding back what may still start a stop string; `finish()` ends
    the sequence and releases everything. At the end `output_text` equals
    `tokenizer.decode(output_token_ids, skip_special_tokens)` except in three documented cases: a tokenizer whose
    decoder strips the first token's leading space (sentencepiece/Metaspace: here the first output token keeps
    its space, since the prompt precedes it, as in vLLM); a prompt ending inside a UTF-8 character (the
    completed character is output); and invalid UTF-8 under a ByteFallback decoder (Llama-2 style), which turns
    a whole run of byte tokens into U+FFFD when any of it is invalid, a rule no window can reproduce.
    Stop token ids and EOS are the engine's: it passes stop_terminated=True with the token that ends the sequence.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stop: list[str] = list(params.stop or [])
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        # Streaming holds back the characters that could start a stop string; with include_stop_str_in_output
        # no text before a stop string is ever removed, so nothing is held.
        longest = max((len(s) for s in self.stop), default=0)
        self._stop_buffer = 0 if self.include_stop_str_in_output else max(longest - 1, 0)

        context = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._num_context = len(context)
        self._ids: list[int] = context  # prompt tail, then output tokens
        self._prefix = 0  # the window is _ids[_prefix:]
        self._read = len(context)  # window tokens before _read are context only
        text = self._decode_window()
        # Chars of the window's text already accounted for; a character the prompt leaves unfinished is output.
        self._emitted = len(text) - min(_trailing_replacements(text), _MAX_PARTIAL_CHARS)

        self.output_text = ""
        self.finished = False
        self.stop_string: str | None = None  # the stop string that ended the sequence
        self._sent = 0  # chars of output_text returned by get_delta

    @property
    def output_token_ids(self) -> list[int]:
        return self._ids[self._num_context:]

    @property
    def num_output_tokens(self) -> int:
        return len(self._ids) - self._num_context

    @property
    def visible_text(self) -> str:
        """output_text less the stop-string hold-back while unfinished: the cumulative text to show."""
        if self.finished:
            return self.output_text
        return self.output_text[: max(len(self.output_text) - self._stop_buffer, self._sent)]

    def update(self, new_token_ids: list[int], stop_terminated: bool = False) -> str | None:
        """Add sampled tokens. stop_terminated: the last one is EOS or a stop token id and ends the sequence;
        like vLLM, its text is left out unless include_stop_str_in_output, and the sequence is finished.
        Returns the stop string that matched (output_text is then cut at it, and the sequence is finished)."""
        if self.finished:
            raise RuntimeError("IncrementalDetokenizer.update() after the sequence finished")
        tokens = list(new_token_ids)
        skipped = tokens.pop() if stop_terminated and tokens and not self.include_stop_str_in_output else None
        check_from = len(self.output_text)
        for token_id in tokens:
            self._ids.append(token_id)
            self.output_text += self._next_text(final=False)
            if self.num_output_tokens <= self.min_tokens:
                check_from = len(self.output_text)  # text of the first min_tokens tokens cannot stop the sequence
        if stop_terminated:  # release held-back characters before the skipped token joins the window
            self.output_text += self._next_text(final=True)
        if skipped is not None:
            self._ids.append(skipped)
        stop = self._check_stop(check_from)
        if stop_terminated:
            self.finished = True
        return stop

    def finish(self) -> str | None:
        """The sequence ended (length, EOS, stop token, abort): release the held-back characters. Returns a stop
        string found in them, if any (output_text is then cut at it)."""
        if self.finished:
            return self.stop_string
        check_from = len(self.output_text)
        self.output_text += self._next_text(final=True)
        stop = self._check_stop(check_from)
        self.finished = True
        return stop

    def get_delta(self) -> str:
        """The visible text added since the last call."""
        text = self.visible_text
        delta = text[self._sent:]
        self._sent = len(text)
        return delta

    def _decode_window(self) -> str:
        return self.tokenizer.decode(self._ids[self._prefix:], skip_special_tokens=self.skip_special_tokens)

    def _next_text(self, final: bool) -> str:
        """The text the window gained, less trailing partial characters unless final."""
        text = self._decode_window()
        held = 0 if final else _trailing_replacements(text)
        stalled = held > 0 and len(self._ids) - self._read > _MAX_PENDING_TOKENS
        if stalled:
            held = min(held, _MAX_PARTIAL_CHARS)
        end = len(text) - held
        new = text[self._emitted:end]
        self._emitted = max(self._emitted, end)
        if held == 0 or stalled:
            # Slide the window: the tokens just turned into text become the context of the next ones.
            self._prefix, self._read = self._read, len(self._ids)
            self._emitted = len(self._decode_window()) - held
        return new

    def _check_stop(self, check_from: int) -> str | None:
        """Find the earliest stop string in the text from check_from on (less the characters a stop string
        could share with the text before it); cut output_text there and finish."""
        if not self.stop or len(self.output_text) <= check_from or self.num_output_tokens <= self.min_tokens:
            return None
        best: tuple[int, str] | None = None
        for stop in self.stop:
            index = self.output_text.find(stop, max(check_from - len(stop) + 1, 0))
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return None
        index, stop = best
        self.output_text = self.output_text[: index + len(stop) if self.include_stop_str_in_output else index]
        self.finished = True
        self.stop_string = stop
        return stop

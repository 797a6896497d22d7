"""ToolCallParser: a sans-I/O state machine that turns streamed model text into tool-call events.

Like h11, it does no I/O: the caller feeds decoded text pieces (split anywhere) and gets
events back. Every character is examined a bounded number of times and nothing is
re-scanned when a piece arrives, so the total work is O(input) however it is split.

Formats (`wrapper`):
  hermes  <tool_call>{"name": ..., "arguments": {...}}</tool_call> anywhere in the text; the
          tag may hold one call object or a JSON list of them.
  json    the message is (after whitespace) one call object, a list of them, or several call
          objects separated by whitespace; a message starting with anything else is text
          (tags are not looked for).
  auto    hermes tags anywhere, plus a bare call object at the very start of the message.
The tags default to <tool_call> / </tool_call>; `open_tag` / `close_tag` take a model family's
own (`agentrt.toolcall.formats`: e.g. "[TOOL_CALLS]" with no close tag, its content a JSON list).
`fences=True` (json / auto) also takes a call in a ```json fence at the start of the message (the
fence is not text; after its closing ``` more fenced or bare calls may follow).

Early stop (`should_stop`, `EarlyStop`), the one documented point per situation:
  * the verdict of call number `max_calls` (parallel_calls=False means max_calls=1): for a
    valid call that is the character closing the call OBJECT (its final '}'), in both
    formats - the closing </tool_call> is not waited for, it carries no information;
  * any CallInvalid when stop_on_invalid=True (an unknown name: its closing quote);
  * parallel calls: after a call container ends (</tool_call>, or a bare object's '}'), the
    first character after whitespace that cannot begin another call (another <tool_call>
    tag, resp. another bare '{'); a bare list's closing ']' stops at once; inside a tag,
    a character after the call JSON that does not begin </tool_call>;
  * malformed bare JSON even when stop_on_invalid=False: without a closing tag to skip to,
    nothing after it can be located (inside a tag, the parser skips to </tool_call>).
`stop_offset` is the offset just past the character that triggered the stop; input after it
is ignored. Whitespace between or after calls is never emitted as text.

Tool schemas are compiled once (pass `load_tool_specs(tools)` to share them between parsers).
A schema "$ref" that cannot be resolved surfaces as ConfigError from feed() when a call
reaches it: it is a bad tool definition, not a bad model output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from agentrt.errors import ConfigError
from agentrt.toolcall.calls import CallContainer
from agentrt.toolcall.fences import FenceStates
from agentrt.toolcall.parse_events import CallInvalid, EarlyStop, Event, EventSink, ParserState, Verdict
from agentrt.toolcall.specs import ToolSpec, load_tool_specs
from agentrt.toolcall.tags import CLOSE_TAG, OPEN_TAG, WS_RUN, match_literal, skip_ws

WRAPPERS = ("hermes", "json", "auto")


class ToolCallParser(FenceStates):
    """Streaming tool-call parser and validator. See the module docstring for the formats.

    feed(text) -> events;  close() -> events (flushes held text, invalidates an unfinished
    call);  should_stop / stop_offset / state describe where it is.
    """

    def __init__(self, tools: object, *, wrapper: str = "auto", parallel_calls: bool = True,
                 max_calls: int | None = None, stop_on_invalid: bool = True, open_tag: str = OPEN_TAG,
                 close_tag: str = CLOSE_TAG, fences: bool = False) -> None:
        if wrapper not in WRAPPERS:
            raise ConfigError(f"wrapper must be one of {', '.join(WRAPPERS)}; got {wrapper!r}")
        for option, value in (("parallel_calls", parallel_calls), ("stop_on_invalid", stop_on_invalid)):
            if not isinstance(value, bool):
                raise ConfigError(f"{option} must be a bool, got {value!r}")
        if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int)
                                      or max_calls < 1):
            raise ConfigError(f"max_calls must be None or an int >= 1, got {max_calls!r}")
        if not parallel_calls and max_calls not in (None, 1):
            raise ConfigError(f"max_calls={max_calls} needs parallel_calls=True")
        if not isinstance(open_tag, str) or not open_tag or not isinstance(close_tag, str):
            raise ConfigError("open_tag must be a non-empty str and close_tag a str")
        self._open, self._close, self._fences = open_tag, close_tag, bool(fences) and wrapper != "hermes"
        self._fenced = False  # the current bare call sits in a ```json fence
        self._fence: list[str] = []  # held fence text while undecided
        self._specs = load_tool_specs(tools)
        self._wrapper = wrapper
        self._max_calls = max_calls if parallel_calls else 1
        self._stop_on_invalid = stop_on_invalid
        self._out = EventSink()
        self._state = ParserState.TEXT if wrapper == "hermes" else ParserState.MESSAGE_START
        self._detect_tags = wrapper != "json"
        self._held_ws: list[str] = []  # leading whitespace while the format is undecided
        self._matched = 0  # characters of OPEN_TAG / CLOSE_TAG matched but not yet decided
        self._container: CallContainer | None = None
        self._bare = False  # the calls so far are bare JSON (else <tool_call> tags)
        self._verdicts = 0
        self._next_index = 0
        self._base = 0  # stream offset of the current piece's first character
        self._stop_offset: int | None = None
        self._steps = 0  # parser loop iterations plus finished containers' scanner steps
        self._handlers: dict[ParserState, Callable[[str, int], int]] = {
            ParserState.MESSAGE_START: self._on_message_start,
            ParserState.TEXT: self._on_text,
            ParserState.IN_CALL: self._on_in_call,
            ParserState.CLOSING_TAG: self._on_closing_tag,
            ParserState.SKIPPING: self._on_skipping,
            ParserState.BETWEEN_CALLS: self._on_between,
            ParserState.FENCE_OPEN: self._on_fence_open,
            ParserState.FENCE_CLOSE: self._on_fence_close,
        }
        self._handler: Callable[[str, int], int] | None = self._handlers[self._state]  # None once stopped or closed

    # -- public --------------------------------------------------------------------------------

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        return self._specs

    @property
    def state(self) -> ParserState:
        return self._state

    @property
    def should_stop(self) -> bool:
        """True once no more useful output can follow (see the module docstring)."""
        return self._stop_offset is not None

    @property
    def stop_offset(self) -> int | None:
        """Stream offset just past the character that triggered the stop, or None."""
        return self._stop_offset

    @property
    def steps(self) -> int:
        """Work counter (loop iterations); grows linearly with the input however it is split."""
        current = self._container.steps if self._container is not None else 0
        return self._steps + current

    def feed(self, text: str) -> list[Event]:
        """Consume the next piece of decoded model text; return the events it completes."""
        if not isinstance(text, str):
            raise ConfigError(f"feed() takes str, got {type(text).__name__}")
        if self._state is ParserState.CLOSED:
            raise ConfigError("feed() called after close()")
        i, n = 0, len(text)
        while i < n and self._handler is not None:
            self._steps += 1
            i = self._handler(text, i)
        self._base += n
        return self._out.take()

    def close(self) -> list[Event]:
        """End of stream: flush held text, invalidate an unfinished call. Idempotent."""
        state = self._state
        if state is ParserState.TEXT and self._matched:
            self._out.text(self._open[: self._matched])
        elif state is ParserState.MESSAGE_START:
            self._out.text("".join(self._held_ws))
        elif state is ParserState.FENCE_OPEN and self._verdicts == 0:
            self._out.text("".join(self._held_ws + self._fence))
        elif state is ParserState.IN_CALL:
            container = self._current()
            container.close()
            self._end_container(container)
        self._held_ws, self._matched = [], 0
        self._enter(ParserState.CLOSED)
        return self._out.take()

    # -- states --------------------------------------------------------------------------------

    def _on_message_start(self, s: str, i: int) -> int:
        m = WS_RUN.match(s, i)
        if m:
            self._held_ws.append(m.group())
            return m.end()
        if s[i] == "{" or (s[i] == "[" and self._wrapper == "json"):
            self._held_ws = []  # whitespace before bare JSON is not text
            self._open_container(bare=True)
        elif s[i] == "`" and self._fences:
            self._fence, self._matched = [], 0
            self._enter(ParserState.FENCE_OPEN)
        else:
            self._out.text("".join(self._held_ws))
            self._held_ws = []
            self._enter(ParserState.TEXT)
        return i  # s[i] is examined again in the new state

    def _on_text(self, s: str, i: int) -> int:
        if self._matched == 0:
            k = s.find(self._open[0], i) if self._detect_tags else -1
            if k < 0:
                self._out.text(s[i:])
                return len(s)
            self._out.text(s[i:k])
            i = k
        matched, j = match_literal(self._open, self._matched, s, i)
        if matched == len(self._open):
            self._matched = 0
            self._open_container(bare=False)
        elif j == len(s):
            self._matched = matched  # held: not text until proven not to be a tag
        else:
            self._out.text(self._open[:matched])  # not a tag after all; s[j] is examined again
            self._matched = 0
        return j

    def _on_in_call(self, s: str, i: int) -> int:
        container = self._current()
        j = container.step(s, i, self._base)
        if not container.token:
            return j
        if container.verdict is not None:
            self._after_verdict(container.verdict, container.trigger_end)
        if self._state is ParserState.STOPPED:
            return j
        if container.failed:  # s[j], the offending character, is not consumed
            self._end_container(container)
            if self._bare or not self._close:
                self._stop(container.trigger_end, "malformed bare JSON: no later call can be located")
            else:
                self._enter(ParserState.SKIPPING)
        elif container.done:
            self._end_container(container)
            if not self._bare:
                self._enter(ParserState.CLOSING_TAG if self._close else ParserState.BETWEEN_CALLS)
            elif self._fenced:
                self._matched = 0
                self._enter(ParserState.FENCE_CLOSE)
            elif container.is_list:
                self._stop(container.trigger_end, "the list of tool calls is closed")
            else:
                self._enter(ParserState.BETWEEN_CALLS)
        return j

    def _on_closing_tag(self, s: str, i: int) -> int:
        if self._matched == 0:
            i = skip_ws(s, i)
            if i == len(s):
                return i
        matched, j = match_literal(self._close, self._matched, s, i)
        if matched == len(self._close):
            self._matched = 0
            self._enter(ParserState.BETWEEN_CALLS)
        elif j == len(s):
            self._matched = matched
        else:
            self._stop(j + 1, f"unexpected text after the tool call JSON inside {self._open}")
        return j

    def _on_skipping(self, s: str, i: int) -> int:
        if self._matched == 0:
            k = s.find(self._close[0], i)
            if k < 0:
                return len(s)
            i = k
        matched, j = match_literal(self._close, self._matched, s, i)
        if matched == len(self._close):
            self._enter(ParserState.BETWEEN_CALLS)
            matched = 0
        elif j < len(s):
            matched = 0  # a mismatch: keep skipping from s[j]
        self._matched = matched
        return j

    def _on_between(self, s: str, i: int) -> int:
        if self._matched == 0:
            i = skip_ws(s, i)
            if i == len(s):
                return i
            if self._bare:
                if s[i] == "{":
                    self._fenced = False
                    self._open_container(bare=True)
                elif s[i] == "`" and self._fences:
                    self._fence = []
                    self._enter(ParserState.FENCE_OPEN)
                else:
                    self._stop(i + 1, "text after the tool calls")
                return i
        matched, j = match_literal(self._open, self._matched, s, i)
        if matched == len(self._open):
            self._matched = 0
            self._open_container(bare=False)
        elif j == len(s):
            self._matched = matched
        else:
            self._stop(j + 1, "text after the tool calls")
        return j

    # -- helpers -------------------------------------------------------------------------------

    def _enter(self, state: ParserState) -> None:
        self._state = state
        self._handler = self._handlers.get(state)

    def _open_container(self, *, bare: bool) -> None:
        self._bare = bare
        self._container = CallContainer(self._specs, self._out, self._next_index)
        self._enter(ParserState.IN_CALL)

    def _current(self) -> CallContainer:
        """The open container: IN_CALL is only entered by _open_container, which sets one."""
        if self._container is None:
            raise RuntimeError("ToolCallParser: no open call container in state IN_CALL")
        return self._container

    def _end_container(self, container: CallContainer) -> None:
        self._container = None
        self._next_index = container.next_index
        self._steps += container.steps

    def _after_verdict(self, verdict: Verdict, trigger_end: int) -> None:
        self._verdicts += 1
        if isinstance(verdict, CallInvalid) and self._stop_on_invalid:
            self._stop(trigger_end, f"tool call {verdict.index} is invalid ({verdict.kind})")
        elif self._max_calls is not None and self._verdicts >= self._max_calls:
            self._stop(trigger_end, f"the last allowed tool call ({self._max_calls}) has ended")

    def _stop(self, end: int, reason: str) -> None:
        """Stop at the piece-local index `end` (just past the triggering character)."""
        if self._container is not None:
            self._end_container(self._container)
        self._stop_offset = self._base + end
        self._enter(ParserState.STOPPED)
        self._out.emit(EarlyStop(reason))

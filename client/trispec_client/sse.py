"""Incremental server-sent-events parser: bytes in (split anywhere), event payloads out.

Follows the SSE field rules that Triton's ``generate_stream`` uses: ``data:`` lines (one optional space
after the colon) joined with newlines, a blank line ends an event, ``:`` lines are comments, other
fields (``event:``, ``id:``, ``retry:``) are ignored. Lines end with LF or CRLF. Bytes are buffered
until a line is complete, so a chunk boundary inside a multi-byte UTF-8 character is harmless.
"""

from __future__ import annotations


class SSEParser:
    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Add bytes; return the ``data`` payload of every event completed by them, in order."""
        self._buffer += chunk
        events: list[str] = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            raw, self._buffer = self._buffer[:end], self._buffer[end + 1 :]
            event = self._line(raw.rstrip(b"\r").decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[str]:
        """End of stream: an event cut short by the end (no blank line after it) is still returned."""
        events = self.feed(b"\n") if self._buffer else []
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            event, self._data = "\n".join(self._data), []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

"""trispec_client's retries, the transports stood in for (``client_stand_ins.Attempts``): refusals for
now retried within the deadline, a refused first contact tries the other replicas first, no retry
for bad input, past the deadline or once text arrived. The pauses are read off a virtual clock
(``virtual_clock.py``), not timed.
"""

from __future__ import annotations

import pytest
from client_stand_ins import CHUNKS, QUEUE_FULL, Attempts
from trispec_client import (
    InvalidRequestError,
    SpecDecConnectionError,
    SpecDecOverloadedError,
    StreamChunk,
)
from trispec_client import client as client_module
from trispec_client.client import RETRY_DELAY_S, _with_retries
from trispec_client.errors import make_error
from virtual_clock import VirtualClock


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    clock = VirtualClock()
    monkeypatch.setattr(client_module, "time", clock)
    return clock


def test_refusals_for_now_are_retried_within_the_deadline(clock: VirtualClock) -> None:
    attempts = Attempts(make_error(QUEUE_FULL, "UNAVAILABLE"), make_error(QUEUE_FULL, "UNAVAILABLE"), CHUNKS)
    assert list(_with_retries(attempts, 30.0, retries=3)) == CHUNKS
    # a pause before each retry, doubling (each jittered to half-whole), taken from the deadline
    first, second = clock.pauses
    assert RETRY_DELAY_S / 2 <= first <= RETRY_DELAY_S and RETRY_DELAY_S <= second <= 2 * RETRY_DELAY_S
    assert len(attempts.given) == 3 and attempts.given[0] == 30.0
    assert attempts.given[1] <= 30.0 - first and attempts.given[2] <= 30.0 - first - second


def test_retries_run_out_and_the_last_refusal_is_raised(clock: VirtualClock) -> None:
    attempts = Attempts(*[make_error(QUEUE_FULL, "UNAVAILABLE") for _ in range(3)])
    with pytest.raises(SpecDecOverloadedError):
        list(_with_retries(attempts, 30.0, retries=2))
    assert len(attempts.given) == 3 and len(clock.pauses) == 2
    attempts = Attempts(make_error(QUEUE_FULL, "UNAVAILABLE"), CHUNKS)
    with pytest.raises(SpecDecOverloadedError):
        list(_with_retries(attempts, 30.0, retries=0))


REFUSED_AT_FIRST_CONTACT = "connection failed: [Errno 111] Connection refused"


def test_a_refused_first_contact_tries_the_other_replicas_before_pausing(clock: VirtualClock) -> None:
    """Several replicas: a request one cannot take (connection refused, restarting, overloaded) goes
    to the next at once; only once every replica failed does it pause, for ``retries`` rounds."""
    attempts = Attempts(SpecDecConnectionError(REFUSED_AT_FIRST_CONTACT), CHUNKS)
    landed = [1]
    assert list(_with_retries(attempts, 30.0, 0, order=[1, 0], landed=landed)) == CHUNKS
    assert attempts.replicas == [1, 0] and landed == [0] and clock.pauses == []  # no pause between them
    refused = [SpecDecConnectionError(REFUSED_AT_FIRST_CONTACT) for _ in range(6)]
    attempts = Attempts(*refused)
    with pytest.raises(SpecDecConnectionError, match="Connection refused"):
        list(_with_retries(attempts, 30.0, 1, order=[0, 1, 2]))
    # two rounds of three, one pause between them: the first of the backoff (half to whole, jittered)
    assert attempts.replicas == [0, 1, 2, 0, 1, 2] and len(clock.pauses) == 1
    assert RETRY_DELAY_S / 2 <= clock.pauses[0] <= RETRY_DELAY_S
    attempts = Attempts(make_error("top_p: must be in (0, 1]", "INVALID_ARGUMENT"), CHUNKS)
    with pytest.raises(InvalidRequestError):  # bad input is bad on every replica
        list(_with_retries(attempts, 30.0, 3, order=[0, 1]))
    assert attempts.replicas == [0]


def test_no_retry_past_the_deadline_for_bad_input_or_once_text_arrived(clock: VirtualClock) -> None:
    attempts = Attempts(make_error(QUEUE_FULL, "UNAVAILABLE"), CHUNKS)
    with pytest.raises(SpecDecOverloadedError):
        list(_with_retries(attempts, 0.05, retries=3))  # the first pause would pass the deadline
    assert clock.pauses == [] and len(attempts.given) == 1
    attempts = Attempts(make_error("top_p: must be in (0, 1]", "INVALID_ARGUMENT"), CHUNKS)
    with pytest.raises(InvalidRequestError):
        list(_with_retries(attempts, 30.0, retries=3))
    received = []
    attempts = Attempts([StreamChunk("a", 1)], CHUNKS)
    stream = _with_retries(attempts, 30.0, retries=3)
    received.append(next(stream))
    stream.close()  # leaving early closes the attempt (cancels the request), and sends nothing again
    assert received == [StreamChunk("a", 1)] and attempts.closed == 1 and len(attempts.given) == 1

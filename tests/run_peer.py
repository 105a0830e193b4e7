"""Run a peer client script (tests/peers/, kept byte for byte as published) as ``__main__``, then close
the ``tritonclient`` gRPC client it left in its globals: ``python tests/run_peer.py SCRIPT ARGS...``.

Why the close: NVIDIA's ``end_to_end_grpc_client.py`` never calls ``client.close()``, so its channel is
closed by ``InferenceServerClient.__del__`` while the interpreter finalizes. tritonclient asks for the
opposite (tritonclient 2.51, ``grpc/_client.py``, ``start_stream``: "When using stream, user must ensure
the InferenceServerClient.close() gets called at exit"). gRPC's ``Channel.close()`` waits until the
channel's daemon thread has handled every completion event of its calls (grpcio,
``_cython/_cygrpc/channel.pyx.pxi``, ``_close``: ``while state.integrated_call_states:
state.condition.wait()``), and finalization has frozen that daemon thread by then. When the server
answers at once (a refusal: about a millisecond) the stream's status can reach the client before its
own half-close completion has been handled (``send_close_from_client`` still pending), so ``close()``
at exit waits forever: about 1 run in 100 hung, always after the refusal had been printed
(docs/serving-errors.md, "NVIDIA's client after a refusal"). Closing here, before finalization, lets
the daemon thread drain; the second close from ``__del__`` then finds the channel closed and returns.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    script = Path(sys.argv[1]).resolve()
    sys.argv = sys.argv[1:]  # the script parses its own arguments, as when run directly
    scope: dict[str, object] = {"__name__": "__main__", "__file__": str(script)}
    try:
        exec(compile(script.read_text(), str(script), "exec"), scope)
    finally:
        client = scope.get("client")
        close = getattr(client, "close", None)
        if close is not None:
            close()


if __name__ == "__main__":
    main()

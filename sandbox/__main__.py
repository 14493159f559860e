"""`python -m sandbox --port 8081 --rate 20 --burst 5`: see --help for the rest."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence

from sandbox.config import parse_argv
from sandbox.process import READY_PREFIX
from sandbox.server import Sandbox

STDIN_FD = 0


def main(argv: Sequence[str] | None = None) -> int:
    config, args = parse_argv(argv)
    sandbox = Sandbox(config)
    # Before the ready line: whoever read it may send SIGTERM at once.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # A process started in the background by a shell inherits SIGINT ignored, and then
    # _thread.interrupt_main() (stdin closed) would do nothing: take Ctrl-C back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sandbox.bind()
    except OSError as exc:
        print(f"sandbox: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1
    # The only line written to stdout: start_sandbox_process reads it and then stops reading.
    print(f"{READY_PREFIX}{sandbox.url}", flush=True)
    if args.stop_on_stdin_close:
        threading.Thread(target=_interrupt_on_stdin_close, daemon=True).start()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C, or stdin closed
        sandbox.run()
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:
    sys.exit(0)  # unwinds sandbox.run(), which stops the server on its way out


def _interrupt_on_stdin_close() -> None:
    # os.read on the descriptor, not sys.stdin: a daemon thread blocked inside a buffered
    # reader's lock makes the interpreter abort on its way out.
    while os.read(STDIN_FD, 4096):
        pass
    _thread.interrupt_main()


if __name__ == "__main__":
    sys.exit(main())

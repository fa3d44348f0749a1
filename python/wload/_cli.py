"""The `wload` console script of the wheel (`[project.scripts]` in pyproject.toml): the command
line runs in the extension (`_wload.main`), the same Rust code as cargo's `wload` binary, so the
wheel alone is the whole tool on a machine without a Rust toolchain.
"""

import signal
import sys

from wload import _wload


def main() -> None:
    # Python's SIGINT handler only sets a flag, which nothing checks while the command runs in
    # Rust: Ctrl-C would do nothing until the command ended, then raise KeyboardInterrupt over
    # its exit status. The binary starts with the default action (Ctrl-C ends it at once while
    # it reads and plans), and installs its own handlers once the work that stops cleanly
    # starts (exit 130, nothing published); so does this process from here on.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_wload.main(sys.argv))

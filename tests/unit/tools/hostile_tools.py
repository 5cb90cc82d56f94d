"""Tools that misbehave, for the pool's tests (the workers import them by
"tests.unit.tools.hostile_tools:<name>")."""

import os
import signal
import sys
import time

ANY = {"type": "object"}


class _Tool:
    description = "misbehaves"
    parameters = ANY


class Sleeper(_Tool):
    """Never returns."""

    name = "sleeper"

    def __call__(self, arguments):
        while True:
            time.sleep(1)


class Spinner(_Tool):
    """Busy forever inside one C call (the GIL held)."""

    name = "spinner"

    def __call__(self, arguments):
        return str(10 ** (10**9))  # ~10 minutes of big-integer arithmetic in C


class Hog(_Tool):
    """Asks for 16 GiB."""

    name = "hog"

    def __call__(self, arguments):
        return str(len(bytearray(16 * 2**30)))


class Flood(_Tool):
    """Returns `size` characters (arguments {"size": int})."""

    name = "flood"
    parameters = {
        "type": "object",
        "properties": {"size": {"type": "integer"}},
        "required": ["size"],
    }

    def __call__(self, arguments):
        return "x" * arguments["size"]


class Printer(_Tool):
    """Prints gigabytes to its stdout, then answers."""

    name = "printer"

    def __call__(self, arguments):
        chunk = "y" * 2**20
        for _ in range(2**12):
            print(chunk)
        return "printed"


class Crasher(_Tool):
    """Kills its own process."""

    name = "crasher"

    def __call__(self, arguments):
        os.kill(os.getpid(), signal.SIGKILL)


class Liar(_Tool):
    """Writes a reply line of its own (garbage) straight to the protocol stream."""

    name = "liar"

    def __call__(self, arguments):
        for fd in range(3, 64):  # the worker's private copy of its stdout is one of these
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and fd != 0:
                    os.write(fd, b"not json at all\n")
            except OSError:
                pass
        return "ok"


class Echo(_Tool):
    """Returns its "text" argument; returns something else than text when asked."""

    name = "echo"
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }

    def __call__(self, arguments):
        if arguments["text"] == "number":
            return 7
        if arguments["text"] == "raise":
            raise KeyError("no such thing")
        print("a stray print", file=sys.stdout)
        return arguments["text"]


class Limits(_Tool):
    """Raises its soft memory and file limits to their hard ones, then reports both (JSON:
    {"as": [soft, hard], "fsize": [soft, hard]})."""

    name = "limits"

    def __call__(self, arguments):
        import json
        import resource

        out = {}
        for key, which in (("as", resource.RLIMIT_AS), ("fsize", resource.RLIMIT_FSIZE)):
            _, hard = resource.getrlimit(which)
            resource.setrlimit(which, (hard, hard))
            out[key] = list(resource.getrlimit(which))
        return json.dumps(out)


class Environ(_Tool):
    """Returns the names of its environment variables (JSON list)."""

    name = "environ"

    def __call__(self, arguments):
        import json

        return json.dumps(sorted(os.environ))

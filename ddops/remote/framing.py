"""Several answers in one remote read, framed so that no content can be taken for a frame.

A reader names its questions (a command's output, a file's bytes, every file a glob matches),
`script` joins them into one shell command, and `parse` reads the answers back by name; each
question's command sits beside the code that reads its answer, as pyinfra keeps a fact's command
beside its parser. Facts, history, apply's restart, `Remote.read_all` and the lock's channel all
frame this way, and no other way.

On the wire every answer is one line: the base64 of its name, one space, then `+` and the base64
of its bytes, or `-` where a file does not exist. Base64's alphabet holds neither a space nor a
newline, so no body (`@@`, NULs, newlines, a line that looks like a frame) and no name (a path
from the host) can end a frame early or start a false one.
"""

from __future__ import annotations

import base64
import shlex

q = shlex.quote


class FramingError(ValueError):
    """A line that is not a frame: the remote read was cut short or something else wrote to stdout."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def output(name: str, command: str) -> str:
    """Shell: the answer `name` is what command prints on stdout (its exit status is not kept;
    its stderr goes where the whole read's stderr goes)."""
    return f"printf '%s +' {_b64(name)}; {{ {command}\n}} | base64 -w0; echo"


def file(name: str, path: str) -> str:
    """Shell: the answer `name` is the file's bytes, absent (None) when it is not a file. A file
    that exists but cannot be read fails the whole read (exit 1), never answers absent."""
    return (f"if [ -f {q(path)} ]; then printf '%s +' {_b64(name)}; base64 -w0 {q(path)} || exit 1; "
            f"else printf '%s -' {_b64(name)}; fi; echo")


def each_file(pattern: str) -> str:
    """Shell: one answer per file the glob matches (quote its fixed parts), named by its path."""
    return (f"for f in {pattern}; do [ -f \"$f\" ] || continue; printf %s \"$f\" | base64 -w0; "
            "printf ' +'; base64 -w0 \"$f\" || exit 1; echo; done")


def script(*questions: str) -> str:
    """One shell command asking every question in order."""
    return "; ".join(questions)


def parse_line(line: str) -> tuple[str, bytes | None]:
    name, sep, body = line.strip().partition(" ")
    try:
        if not sep or body[:1] not in ("+", "-") or (body == "-") is not (body[:1] == "-"):
            raise ValueError("not name, space, +base64 or -")
        return (base64.b64decode(name, validate=True).decode(),
                None if body == "-" else base64.b64decode(body[1:], validate=True))
    except ValueError as exc:   # binascii.Error and UnicodeDecodeError are ValueErrors
        raise FramingError(f"not a framed answer ({exc}): {line[:80]!r}") from None


def parse(text: str) -> dict[str, bytes | None]:
    """Every answer of a read, by name, in the order asked."""
    return dict(parse_line(line) for line in text.splitlines() if line.strip())


def ask(remote, *questions: str, **run) -> dict[str, bytes | None]:
    """Ask every question in one round trip (run: Remote.run's options, e.g. timeout)."""
    return parse(remote.run(script(*questions), **run).stdout)


def text(answers: dict[str, bytes | None], name: str) -> str | None:
    """An answer as text (None when absent or not asked)."""
    body = answers.get(name)
    return None if body is None else body.decode()

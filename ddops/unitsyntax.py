"""systemd's syntax for the values ddops writes into units and env files: what a value may
contain, how it is spelled, and a reader of the same rules to check what was written.

Values are data, never code (systemd.syntax(7), systemd.service(5) "Command lines",
systemd.exec(5) EnvironmentFile=):
- unit and env files are line based, so a newline or any other control character in a value
  would start a setting of its own: such values are refused (`unsafe_text`), never escaped;
- `%` starts a specifier in unit settings: written `%%` (env files have no specifiers);
- in ExecStart=, `$NAME` and `${NAME}` are replaced from the environment: written `$$`;
  words split on whitespace, double quotes group, and inside them `\\` and `\"` stand for
  the character itself;
- an env file line is NAME=VALUE; inside double quotes a backslash makes one of `"\\`$` literal
  and is kept before any other character, so those four are the ones escaped.
"""

from __future__ import annotations

import re
import unicodedata

PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]+")  # needs no quotes anywhere ddops writes it
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_ESCAPED = '"\\`$'  # escaped by a backslash inside an env file's double quotes
SEPARATORS = ("\u2028", "\u2029", "\x85")  # line breaks to some readers; never needed in a value


def unsafe_text(value: str) -> str | None:
    """Why `value` cannot go into a unit or env file, or None when it can."""
    for char in value:
        if char == "\n":
            return "contains a newline (it would start a line of its own in the unit)"
        if unicodedata.category(char) == "Cc" or char in SEPARATORS:
            return f"contains the control character U+{ord(char):04X}"
        if unicodedata.category(char) == "Cs":
            return f"contains the unpaired surrogate U+{ord(char):04X}"
    return None


def setting(value: str) -> str:
    """A value for a plain unit setting (Description=, WorkingDirectory=): specifiers escaped."""
    return value.replace("%", "%%")


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_word(arg: str) -> str:
    """One ExecStart= word that systemd hands to the process as exactly `arg`."""
    text = arg.replace("%", "%%").replace("$", "$$")
    return text if PLAIN.fullmatch(arg) else _quoted(text)


def path_word(path: str) -> str:
    """One word of a path list (ReadWritePaths=): quoted when needed, specifiers escaped."""
    text = path.replace("%", "%%")
    return text if PLAIN.fullmatch(path) else _quoted(text)


def env_value(value: str) -> str:
    """A value for an EnvironmentFile= line, double-quoted unless plainly safe."""
    if PLAIN.fullmatch(value):
        return value
    return '"' + "".join("\\" + c if c in ENV_ESCAPED else c for c in value) + '"'


# -- readers: the same rules backwards ------------------------------------------------------

def settings(unit_text: str) -> list[tuple[str, str, str]]:
    """(section, key, raw value) of every setting, continuation lines joined by a space."""
    found, section, pending = [], "", ""
    for line in unit_text.split("\n"):
        if not pending and line.lstrip().startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped[1:-1]
        elif "=" in stripped:
            key, _, value = stripped.partition("=")
            found.append((section, key.strip(), value.strip()))
    return found


def setting_value(unit_text: str, key: str) -> str | None:
    """The last raw value of `key` (any section), or None."""
    values = [value for _, name, value in settings(unit_text) if name == key]
    return values[-1] if values else None


def split_exec(raw: str) -> list[str]:
    """ExecStart='s words as the process receives them (`$$` -> `$`; `${NAME}` left as is)."""
    text = raw.lstrip("-@:+!").replace("%%", "%")
    return [_unescape_dollars(word) for word in _split_words(text)]


C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "s": " ", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _split_words(text: str) -> list[str]:
    """Words split on blanks; quotes group; a backslash escapes one character (C escapes for
    units ddops did not write; ddops itself writes only `\\\\` and `\\"` inside quotes)."""
    words, word, quote, escaped, started = [], [], None, False, False
    for char in text:
        if escaped:
            word.append(C_ESCAPES.get(char, char))
            escaped = False
        elif char == "\\":
            escaped = started = True
        elif quote:
            if char == quote:
                quote = None
            else:
                word.append(char)
        elif char in "\"'":
            quote, started = char, True
        elif char in " \t":
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(char)
            started = True
    if quote or escaped:
        raise ValueError(f"unterminated quote or escape in {text!r}")
    if started:
        words.append("".join(word))
    return words


def _unescape_dollars(word: str) -> str:
    return word.replace("$$", "$")


def parse_env(text: str) -> dict[str, str]:
    """An EnvironmentFile= as systemd reads it: NAME -> value. Comments and blank lines are
    skipped; values are one line each (ddops never writes another kind)."""
    found: dict[str, str] = {}
    for line in text.split("\n"):
        stripped = line.lstrip()
        if not stripped or stripped.startswith(("#", ";")) or "=" not in stripped:
            continue
        name, _, rest = stripped.partition("=")
        if ENV_NAME.fullmatch(name.strip()):
            found[name.strip()] = _env_value(rest)
    return found


def _env_value(rest: str) -> str:
    """systemd's value states on one line: before a value blanks are skipped and a quote opens;
    a plain value runs to the line's end (a backslash makes the next character literal,
    trailing blanks are dropped); '...' is literal; "..." unescapes ENV_ESCAPED only.
    After a closing quote the next part starts as before a value."""
    out: list[str] = []
    state, trailing, chars = "pre", 0, iter(rest)
    for char in chars:
        if state == "double":
            if char == '"':
                state = "pre"
            elif char == "\\":
                nxt = next(chars, "")
                out.append(nxt if nxt in ENV_ESCAPED else "\\" + nxt)
            else:
                out.append(char)
        elif state == "single":
            if char == "'":
                state = "pre"
            else:
                out.append(char)
        elif state == "pre" and char in "\"'":
            state = "double" if char == '"' else "single"
        elif state == "pre" and char in " \t":
            continue
        else:
            state = "plain"
            if char == "\\":
                out.append(next(chars, ""))
                trailing = 0
            else:
                out.append(char)
                trailing = trailing + 1 if char in " \t" else 0
    if state in ("double", "single"):
        raise ValueError(f"unterminated quote in env value {rest!r}")
    return "".join(out[:len(out) - trailing] if state == "plain" else out)

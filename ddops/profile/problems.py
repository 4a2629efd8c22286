"""Turn validation errors into one-line problems that name file, key, line and reason."""

from __future__ import annotations

import difflib

from pydantic import BaseModel

from ddops.profile.yamlfile import dotted, problem

Where = dict[str, tuple[str, int | None]]  # dotted key -> (file, line) that set it


def located(key: str, reason: str, fallback_file: str, where: Where) -> str:
    """Name the file and line that set `key`, or those of its nearest ancestor that is set."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in where:
            file, line = where[prefix]
            return problem(file, key, reason, line)
    return problem(fallback_file, key, reason)


def schema_problem(err: dict, root: type[BaseModel], fallback_file: str, where: Where,
                   loc_prefix: tuple = ()) -> str:
    """One pydantic error as a problem line; unknown keys get a did-you-mean hint."""
    loc = (*loc_prefix, *err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        reason = "unknown key" + _suggestion(root, err["loc"])
    elif kind == "missing":
        reason = "required key is missing"
    else:
        reason = err["msg"].removeprefix("Value error, ")
        reason = reason[:1].lower() + reason[1:]
        if not isinstance(err.get("input"), (dict, list)):
            reason += f" (got {err['input']!r})"
    return located(dotted(loc), reason, fallback_file, where)


def _suggestion(root: type[BaseModel], loc: tuple) -> str:
    model = root
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    known = [k for k in model.model_fields if k != "name"]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"

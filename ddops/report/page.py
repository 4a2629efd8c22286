"""The HTML around the charts: one self-contained file (inline CSS and SVG, no scripts, no
links to fetch), readable offline and attachable to a CI run."""

from __future__ import annotations

from html import escape

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ddd; padding: 3px 8px; }
th { background: #f4f4f4; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.pass { color: #2d7a3e; font-weight: 600; } .fail { color: #b3262b; font-weight: 600; }
.text { font-family: ui-monospace, monospace; white-space: pre-wrap; max-width: 40em; }
mark { background: #ffd7d5; } .same { color: #777; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
"""


def document(title: str, sections: list[str]) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
            f"<body><h1>{escape(title)}</h1>{''.join(sections)}</body></html>\n")


def section(heading: str, *parts: str) -> str:
    return f"<section><h2>{escape(heading)}</h2>{''.join(parts)}</section>"


def chart(svg: str, caption: str) -> str:
    return f"<figure class=\"chart\">{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Cells are HTML already (use `cell`)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def cell(value, css: str = "") -> str:
    if isinstance(value, float):
        text, css = f"{value:.4g}", css or "num"
    elif isinstance(value, int) and not isinstance(value, bool):
        text, css = str(value), css or "num"
    else:
        text = "" if value is None else str(value)
    return f"<td class=\"{css}\">{escape(text)}</td>" if css else f"<td>{escape(text)}</td>"


def verdict(passed: bool, words: tuple[str, str] = ("passed", "failed")) -> str:
    return f"<span class=\"{'pass' if passed else 'fail'}\">{words[0] if passed else words[1]}</span>"

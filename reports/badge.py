"""An SVG badge in the shields.io style: "openreg | full · 10/10 optional · 100%".

Left: the backend's name (and its module, when the manifest's name is
something else). Right: the level reached, how many of the optional features
the backend claims, and the percentage of claimed contracts satisfied,
coloured by level (grey while incomplete, and for a narrowed run, which
certifies nothing).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from .text import backend_label, narrowed_by, optional_claimed, printable, satisfied_percent, truncate

COLOURS = {None: "#e05d44", "core": "#dfb317", "standard": "#a4a61d", "full": "#4c1"}
INCOMPLETE = "#9f9f9f"
NAME_LIMIT = 40
CHAR_WIDTH = 7  # Verdana 11px, roughly; the badge only needs to be wide enough
PADDING = 10
SVG = "http://www.w3.org/2000/svg"


def _width(text: str) -> int:
    return len(text) * CHAR_WIDTH + 2 * PADDING


def render(document: dict[str, Any]) -> str:
    summary = document["summary"]
    name = truncate(printable(backend_label(document)).replace("\n", " "), NAME_LIMIT) or "backend"
    optional = optional_claimed(document).replace(" features", "")
    value = f"{summary['level_reached'] or 'none'}" + (f" · {optional}" if optional else "") \
        + f" · {satisfied_percent(document)}%"
    narrowed = bool(narrowed_by(document))
    if narrowed:
        value += " narrowed"
    if not document["complete"]:
        value += " incomplete"
    colour = COLOURS[summary["level_reached"]] if document["complete"] and not narrowed else INCOMPLETE
    left, right = _width(name), _width(value)
    total = left + right
    ET.register_namespace("", SVG)
    svg = ET.Element(f"{{{SVG}}}svg", width=str(total), height="20", role="img",
                     **{"aria-label": f"{name}: {value}"})
    ET.SubElement(svg, f"{{{SVG}}}title").text = f"{name}: {value}"
    clip = ET.SubElement(svg, f"{{{SVG}}}clipPath", id="round")
    ET.SubElement(clip, f"{{{SVG}}}rect", width=str(total), height="20", rx="3")
    shapes = ET.SubElement(svg, f"{{{SVG}}}g", **{"clip-path": "url(#round)"})
    ET.SubElement(shapes, f"{{{SVG}}}rect", width=str(left), height="20", fill="#555")
    ET.SubElement(shapes, f"{{{SVG}}}rect", x=str(left), width=str(right), height="20", fill=colour)
    texts = ET.SubElement(svg, f"{{{SVG}}}g", fill="#fff", **{
        "text-anchor": "middle", "font-family": "Verdana,DejaVu Sans,sans-serif", "font-size": "11"})
    for x, text in ((left / 2, name), (left + right / 2, value)):
        ET.SubElement(texts, f"{{{SVG}}}text", x=f"{x:g}", y="14").text = text
    return ET.tostring(svg, encoding="unicode") + "\n"

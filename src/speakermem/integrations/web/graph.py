"""Who talks to whom, drawn: a circle of people and an arrow per speaker -> addressee pair,
thicker for more messages. Pure layout; the template writes the SVG elements (presentation
attributes only, so the page's CSP needs no inline style)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from speakermem.memory.console import Graph

SIZE = 640
MARGIN = 110
MAX_WIDTH = 9.0


@dataclass(frozen=True)
class Node:
    user_id: str
    label: str
    x: float
    y: float
    anchor: str
    """SVG text-anchor for the label: start on the right half, end on the left."""
    lx: float
    ly: float


@dataclass(frozen=True)
class Arrow:
    x1: float
    y1: float
    x2: float
    y2: float
    width: float
    messages: int
    title: str


@dataclass(frozen=True)
class Drawing:
    size: int
    nodes: list[Node]
    arrows: list[Arrow]


def layout(graph: Graph) -> Drawing:
    """Place the people of the edges on a circle (busiest first, clockwise from the top) and
    turn each edge into an arrow between them, offset so A->B and B->A do not overlap."""
    weight: dict[str, int] = {}
    for e in graph.edges:
        weight[e.speaker] = weight.get(e.speaker, 0) + e.messages
        weight[e.addressee] = weight.get(e.addressee, 0) + e.messages
    people = sorted(weight, key=lambda p: (-weight[p], p))
    centre = SIZE / 2
    radius = centre - MARGIN
    nodes: dict[str, Node] = {}
    for i, person in enumerate(people):
        angle = -math.pi / 2 + 2 * math.pi * i / max(1, len(people))
        x, y = centre + radius * math.cos(angle), centre + radius * math.sin(angle)
        lx, ly = centre + (radius + 14) * math.cos(angle), centre + (radius + 14) * math.sin(angle)
        nodes[person] = Node(
            user_id=person,
            label=graph.names.get(person, person),
            x=round(x, 1),
            y=round(y, 1),
            anchor="start" if math.cos(angle) >= -1e-9 else "end",
            lx=round(lx, 1),
            ly=round(ly + 4, 1),
        )
    top = max((e.messages for e in graph.edges), default=1)
    arrows = []
    for e in graph.edges:
        a, b = nodes[e.speaker], nodes[e.addressee]
        dx, dy = b.x - a.x, b.y - a.y
        length = math.hypot(dx, dy) or 1.0
        # a little to the right of the line, and short of the target's dot
        ox, oy = -dy / length * 4, dx / length * 4
        shrink = 12 / length
        arrows.append(
            Arrow(
                x1=round(a.x + ox + dx * shrink, 1),
                y1=round(a.y + oy + dy * shrink, 1),
                x2=round(b.x + ox - dx * shrink, 1),
                y2=round(b.y + oy - dy * shrink, 1),
                width=round(1.0 + (MAX_WIDTH - 1.0) * math.sqrt(e.messages / top), 1),
                messages=e.messages,
                title=f"{a.label} → {b.label}: {e.messages} messages",
            )
        )
    return Drawing(size=SIZE, nodes=list(nodes.values()), arrows=arrows)

"""What the report's charts share: the roles' colours and short names, the attention colour scale, the line
colours and dashes, and one layout. Each chart itself lives with its measure (report/measures/: chart(section)
-> a plotly Figure, or None when there is nothing to draw)."""

from __future__ import annotations

ROLE_COLORS = {
    "previous_token": "#4C78A8", "duplicate_token": "#72B7B2", "induction": "#E45756", "positional": "#F58518",
    "syntactic": "#54A24B", "rare_word": "#B279A2", "sink": "#9D755D",
}
NONE_COLOR = "#ECECF2"
ROLE_SHORT = {"previous_token": "PREV", "duplicate_token": "DUP", "induction": "IND", "positional": "POS",
              "syntactic": "SYN", "rare_word": "RARE", "sink": "SINK"}
# attention weights: most are small, so the scale spends its colours on the low end
ATTN_SCALE = [[0.0, "#ffffff"], [0.03, "#eef4fb"], [0.1, "#c6dbef"], [0.25, "#6baed6"], [0.5, "#2171b5"],
              [1.0, "#08306b"]]
FONT = dict(family="Inter, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif", size=12, color="#1f2330")


def layout(fig, *, height: int, **kw):
    kw.setdefault("margin", dict(l=60, r=20, t=40, b=50))
    fig.update_layout(template="plotly_white", font=FONT, height=height, paper_bgcolor="rgba(0,0,0,0)",
                      plot_bgcolor="rgba(0,0,0,0)", **kw)
    return fig


DASHES = ["solid", "dash", "dot", "dashdot", "longdash"]
LINE_COLORS = ["#4C78A8", "#E45756", "#54A24B", "#F58518", "#B279A2", "#72B7B2"]

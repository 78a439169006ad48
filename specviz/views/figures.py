"""The figures' look, written once: every chart of the app is laid out here.

One look for all of them: transparent backgrounds and one grey ink for their text (``FONT_COLOR``, the
page's muted grey: 4.5:1 or more on Gradio's light surfaces; in dark mode the style sheet redraws that ink in the
dark muted grey, see assets/style.css "Plotly charts" and specviz.views.contrast.chart_checks), soft grid lines, one
template and one hover label.  Plotly's toolbar (the modebar) is hidden by the style sheet on every chart: on a touch
screen it stayed over the title.  Two layouts:

* :func:`compact_layout`: the live-run charts (trace, race, tree, machine), which sit three to a row:
  fixed height, centred title, room for each line of the subtitle, legend under the plot.
* :func:`wide_layout`: the full-width charts (theory tab, sweeps, shoot-out): left title, legend
  under the plot, the height given by the caller.

:func:`empty_figure` is a figure that says why it is empty (``meta={"empty": True}``), in either
layout; :func:`safe_figure` runs a wide chart's builder and turns bad numbers into such a figure.
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

import plotly.graph_objects as go

# The charts' ink: titles, subtitles, ticks, axis titles, legends, labels (and reference lines).  It is the page's
# light muted grey (--sv-muted in assets/style.css): 4.5:1 or more on every light surface; in dark mode the style
# sheet redraws this exact colour as the dark muted grey (tests/test_contrast.py computes both).
FONT_COLOR = "#5f6673"
GRID_COLOR = "rgba(128, 128, 128, 0.22)"
FONT_FAMILY = "system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif"
TEMPLATE = "plotly_white"
CLEAR = "rgba(0,0,0,0)"
HEIGHT = 360  # a compact chart without a legend, and every empty figure
EMPTY_WRAP = 38  # characters a line of an empty figure's message: a plot on a phone is ~330 px wide
NO_DATA = "no data"


def _set_template(fig: go.Figure) -> None:
    """``fig.update_layout(template=TEMPLATE)``, without plotly validating its own registered template
    again: that deep-copies it through the constructors (~40-120 ms a figure on a 2-core machine, most
    of the cost of drawing a live run's charts).  Plotly sets its default template on every new figure
    this way (BaseFigure._initialize_layout_template); the figure's JSON is the same."""
    import plotly.io as pio

    if not getattr(fig, "_allow_disable_validation", False):
        fig.update_layout(template=TEMPLATE)
        return
    layout = fig.layout
    layout._validate = False
    try:
        layout.template = pio.templates[TEMPLATE]
    finally:
        layout._validate = fig._validate


_AXES_LOOK = dict(gridcolor=GRID_COLOR, zerolinecolor=GRID_COLOR, linecolor=GRID_COLOR)


def _layout_look(font_size: int | None) -> dict[str, Any]:
    font: dict[str, Any] = dict(family=FONT_FAMILY, color=FONT_COLOR)
    if font_size:
        font["size"] = font_size
    return dict(paper_bgcolor=CLEAR, plot_bgcolor=CLEAR, font=font,
                hoverlabel=dict(font=dict(family=FONT_FAMILY, size=12)))


def apply_look(fig: go.Figure, font_size: int | None = None) -> go.Figure:
    """The part every figure shares: template, transparent backgrounds, font, hover label, grid colour."""
    _set_template(fig)
    fig.update_layout(**_layout_look(font_size))
    fig.update_xaxes(**_AXES_LOOK)  # every subplot's axes
    fig.update_yaxes(**_AXES_LOOK)
    return fig


def compact_layout(
    fig: go.Figure, title: str, x_title: str = "", y_title: str = "", subtitle: str = "", legend: bool = True
) -> go.Figure:
    """A live-run chart, a third of a row: fixed height (taller by the legend's row), centred title.
    The look (apply_look, font size 13) goes in the same three updates: each update of a plotly
    figure costs ~5-10 ms whatever it sets, and a live run draws nine of these charts."""
    _set_template(fig)
    fig.update_layout(
        **_layout_look(13),
        title=dict(
            text=title,
            subtitle=dict(text=subtitle, font=dict(size=12, color=FONT_COLOR)),
            x=0.5,
            xanchor="center",
            xref="container",
            y=0.97,
            yanchor="top",
            yref="container",
            font=dict(size=16),
        ),
        # Room for the title and each line of the subtitle (a figure shares a row with two others,
        # so long subtitles are broken with <br>; tests/test_views checks that every line fits).
        margin=dict(l=64, r=24, t=(84 + 18 * subtitle.count("<br>")) if subtitle else 56, b=100 if legend else 62),
        # The legend at the figure's foot (container coordinates), under the x-axis title, not on it: anchored to the
        # plot (y = -0.2 of its height) it sat on the title of a chart whose subtitle took more lines (issue 65).
        legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.01, xanchor="left", x=0, bgcolor=CLEAR,
                    font=dict(size=12)),
        height=HEIGHT + (40 if legend else 0),
        showlegend=legend,
        bargap=0.25,
    )
    fig.update_xaxes(**_AXES_LOOK, title=dict(text=x_title), showline=True, automargin=True)
    fig.update_yaxes(**_AXES_LOOK, title=dict(text=y_title), showline=True, automargin=True)
    return fig


# Characters a line of a full-width chart's subtitle: a chart on a 400 px phone is ~336 px wide and the page's
# sans-serif takes ~7.2 px a character at 10 px (measured in Chromium: 54 characters at 11 px took 430 px).
WIDE_WRAP = 40
LEGEND_WRAP = 44  # characters a legend entry's line: one entry must fit a phone's plot width


def wrap_html(text: str, width: int) -> str:
    """``text`` (plotly's HTML: <br> lines, a line wrapped in one tag such as <span style=…>…</span>) broken into
    lines of at most ``width`` characters; a line with other markup inside is left as it is."""
    import re

    out: list[str] = []
    for seg in text.split("<br>"):
        m = re.fullmatch(r"((?:<[a-zA-Z][^>]*>)+)([^<]*)((?:</[a-zA-Z]+>)+)", seg)  # text in one or more tags
        if m:
            out += [f"{m.group(1)}{line}{m.group(3)}" for line in textwrap.wrap(m.group(2), width) or [m.group(2)]]
        elif "<" not in seg:
            out += textwrap.wrap(seg, width) or [seg]
        else:
            out.append(seg)
    return "<br>".join(out)


def wide_layout(fig: go.Figure, title: str, subtitle: str | None = None, **kw: Any) -> go.Figure:
    """A full-width chart; ``kw`` goes to ``update_layout`` (the height, at least).

    Made to read on a 400 px phone as on a desktop: the subtitle is wrapped (and the top margin holds every line),
    long legend entries are wrapped, and the legend sits at the foot of the figure with room for one entry a line,
    so neither is cut off nor drawn over the x-axis title (issue 56)."""
    apply_look(fig)
    # The title block hangs from the figure's top, so its subtitle lines grow down into the margin kept for them.
    t: dict[str, Any] = dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=12))
    lines = 0
    if subtitle:
        subtitle = wrap_html(subtitle, WIDE_WRAP)
        lines = subtitle.count("<br>") + 1
        t["subtitle"] = dict(text=subtitle, font=dict(size=10))
    legend_lines = 0
    for trace in fig.data:
        name = getattr(trace, "name", None)
        if isinstance(name, str) and trace.showlegend is not False:
            if len(name) > LEGEND_WRAP and "<br>" not in name:
                trace.name = name = "<br>".join(textwrap.wrap(name, LEGEND_WRAP))
            legend_lines += name.count("<br>") + 1
    top = 66 + 15 * lines
    bottom = 84 + 19 * legend_lines  # the x-axis title, then the legend's entries stacked as on a phone
    if "height" in kw:  # the plot keeps the height the caller asked for
        kw["height"] = kw["height"] + max(0, top - 90) + max(0, bottom - 120)
    fig.update_layout(
        title=t,
        hovermode="closest",
        # Legend at the foot of the figure, clear of the x-axis title.
        legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.01, xanchor="left", x=0,
                    font=dict(size=11)),
        margin=dict(t=top, b=bottom),
        **kw,
    )
    return fig


def empty_figure(title: str, message: str = "No data yet", *, wide: bool = False) -> go.Figure:
    """A blank figure that says why it is blank, the message broken into lines that fit a narrow plot.

    ``wide`` gives it the full-width charts' title (left, plotly's default margins) in place of a
    compact chart's; both are ``HEIGHT`` tall.
    """
    fig = go.Figure()
    if wide:
        apply_look(fig)
        fig.update_layout(title=dict(text=title), height=HEIGHT)
    else:
        compact_layout(fig, title, legend=False)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.add_annotation(
        text="<br>".join(textwrap.wrap(message, EMPTY_WRAP)) or message,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        showarrow=False,
        font=dict(size=15, color=FONT_COLOR),
    )
    fig.update_layout(meta={"empty": True})
    return fig


def safe_figure(title: str, build: Callable[[], go.Figure], *, wide: bool = True) -> go.Figure:
    """Run a figure builder; bad numbers become an empty figure that says so, not an exception."""
    try:
        return build()
    except (ValueError, TypeError, ZeroDivisionError, RuntimeError) as exc:
        return empty_figure(title, f"{NO_DATA}: {exc}", wide=wide)


__all__ = [
    "EMPTY_WRAP",
    "FONT_COLOR",
    "FONT_FAMILY",
    "GRID_COLOR",
    "HEIGHT",
    "NO_DATA",
    "TEMPLATE",
    "WIDE_WRAP",
    "apply_look",
    "compact_layout",
    "empty_figure",
    "safe_figure",
    "wide_layout",
    "wrap_html",
]

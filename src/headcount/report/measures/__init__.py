"""The report's measures, one module each: its step, its cache key, its typed section, its card and its chart.

    NAME                          the section's key in report.json (and its step's name)
    steps(ctx) -> [Step]          what collect.py runs and caches (context.Step: name, cache-key params, run)
    a Section dataclass           what the section holds, typed (sections.ReportData gathers them)
    chart(section) -> Figure      the section's plotly figure, or None when there is nothing to draw
    card(report) -> str           the section's part of the page, from the typed report (sections.ReportData)

steps.py lists the modules in report.json's order; html.py puts the cards in the page's order. A measure module
imports the analysis it runs, section_base, context and page (never sections.py, html.py or the claims), so the
claims and the page can read every section without an import cycle.

Adding a measure: write its module here (the four parts above), add it to steps.MEASURES, its Section to
sections.ReportData, its card to html.CARDS (and NAV), and its example to example.py.
"""

"""The page's panels, one class each: Generate (with the Stop and /generate), Why, What-if, Compare, Steps,
Model (Load, presets, the settings controls) and the Benchmark tab (ui.bench_tab.BenchTab).

A panel names the components of ui.page it reads and writes (ui.page's attribute names), holds its
handlers and wires its own events: `panel.wire(page)` inside the page's gr.Blocks. Handlers are bound by
name (ui.panels.wiring); what a panel needs of the server or a model comes through serving's public
requests and methods (hispec.serving.session.Server), never its registry or limits. app.build() is the
list of panels.
"""

"""The app's page: layout (page), its panels (ui/panels: Generate, Why, What-if, Compare, Steps, Model, each
with its handlers, wired by name; bench_tab: the Benchmark tab), what turns serving's updates into components
(generate_view, controls), and views (render, charts, token_story, steps_view, beliefs_view)."""

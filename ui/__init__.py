"""The app's page: layout (page), handlers that turn serving's updates into components (controller,
generate_view, bench_tab, controls), and views (render, charts, token_story, steps_view, beliefs_view)."""

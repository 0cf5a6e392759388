"""The page's explanations of a run: why this speed (why, plans, speed_model), what if the exits agreed
more often (what_if: timing-only runs), and what each exit believes (beliefs)."""

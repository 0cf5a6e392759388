"""The app's views: HTML of coloured tokens, Plotly charts and the streaming handlers."""

"""Views of recorded runs: animation frames, escaped HTML token strips, plotly figures, trace exports."""

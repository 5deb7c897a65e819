"""Gradio UI only: layout, handlers, figures, explainer text. All model work goes through model/."""

"""The terminal: each command's typed result → rich tables and text. Renderers compute nothing."""

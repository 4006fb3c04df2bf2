"""The API's routers, one per area: health and models, shapes, attention and heads, experiments,
code."""

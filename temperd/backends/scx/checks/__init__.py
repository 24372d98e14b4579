"""The checks behind scx/validate.py, one module per part of a scx_layered config: the top level
and each layer's keys (`top_level`), its match rules (`matches`), its kind and the kind's fields
(`layer_kind`), the CPU share a Confined or Grouped layer asks for (`cpu_share`) and the rest of
its tuning (`tuning`). They share the vocabulary of findings (`problems`), what scx_layered's
config holds (`spec`) and the JSON type checks (`value_types`)."""

"""The bundled demo trainer: a small char-level transformer on CPU, with a fault for every scenario."""

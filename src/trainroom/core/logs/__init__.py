"""The log readers: the trainer's printed lines, their shapes, the formats of the frameworks that print them."""

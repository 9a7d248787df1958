"""The Textual control room: a pure client of the keeper."""

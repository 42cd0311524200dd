"""bw24chat: a terminal chat app with its own LLM inference engine."""

__version__ = "0.1.0"

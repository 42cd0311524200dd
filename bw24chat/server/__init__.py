"""The OpenAI-compatible HTTP server (``bw24chat serve``); see :mod:`bw24chat.server.app`."""
from .app import add_serve_args, create_app, serve, serve_from_args, start_in_thread

__all__ = ["add_serve_args", "create_app", "serve", "serve_from_args", "start_in_thread"]

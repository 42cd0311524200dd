"""The Textual chat app.  Open it with ``bw24chat.tui.app.run_app(options)``.

Layout: ``app.py`` (the App: engine loading, config, conversations store), ``screens/`` (one
module per screen), ``widgets/``, ``messages.py`` (the Message classes widgets and workers
talk through), ``commands.py`` (slash commands and command-palette entries) and the one
stylesheet ``bw24chat.tcss``.
"""

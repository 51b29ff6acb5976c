"""The web console: see, search and govern what the bot remembers (`speakermem web`)."""

DEFAULT_PORT = 8780
"""Where `speakermem web` listens unless --port or SPEAKERMEM_WEB_PORT says otherwise (here,
not in the server module, so the CLI's parser shows it without importing the server)."""

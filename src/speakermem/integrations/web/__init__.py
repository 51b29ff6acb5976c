"""The web console: see, search and govern what the bot remembers (`speakermem web`)."""

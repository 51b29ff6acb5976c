"""bot package."""

"""writer package."""

"""Running hdeval on engines it does not ship (each imported only when used)."""

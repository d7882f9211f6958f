"""Progress listeners (placeholder; the CLI helper replaces this module)."""

"""standard."""

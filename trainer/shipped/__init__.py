"""What ships inside every export, copied whole: the standalone controller (numpy only, imports nothing of the
product)."""

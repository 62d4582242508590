"""Scripts that make the data files kvbench ships (not part of the installed package)."""

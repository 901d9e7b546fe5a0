"""HTTP routes of the proxy."""

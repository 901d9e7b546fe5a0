"""The operator console at /console: pages and assets served by the proxy itself
(docs/console.md)."""
